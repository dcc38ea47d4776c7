// bfloat16 linear layers on CPUs: out = x W^T (+ b), W packed once at load.
//
// A decode step reads every weight once for a few rows of x, so the product is bound by memory
// bandwidth; oneDNN reaches about half of it at one row here. The packed layout is units of 16
// output features, each unit [K/2][16][2]: one 64-byte line holds 16 features' pair of
// consecutive inputs, what one AVX512-BF16 vdpbf16ps multiplies by a broadcast pair of x. A unit is
// one contiguous stream; several are read at once, so one row of x keeps independent sums going,
// each prefetched 2 KiB ahead (a speculative step's 5 rows ran 15% faster with it, one row the
// same). Several rows share each line read: a step of 5 verification rows is one pass.
//
// One product per instruction-set level, all over the same layout and with the same sums: per
// output, over the input pairs in order, the odd input's product and then the even one's, each
// added to a float32 sum, as vdpbf16ps defines them (a product of two bfloat16 values is exact in
// float32, so a fused multiply-add rounds as that add does). AVX512-BF16 multiplies the pairs;
// AVX-512 and AVX2 widen them (a bfloat16 is the top half of a float32) and multiply-add 16 or 8
// features at a time; the portable product does the same a feature at a time. Each output row is
// summed in that one order whatever the number of rows: a row's result does not depend on the rows
// beside it, as a speculative step's verification rows must equal the decode steps they stand for.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_bf16.h"
#include "cpu_device.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kUnit = 16;   // output features per unit
constexpr int64_t kAhead = 32;  // pairs prefetched ahead: 32 lines of 64 bytes
// Units read at once and rows of x summed at once, as the level's registers hold their sums.
#if defined(__AVX512BF16__)
constexpr int kMaxUnits = 4, kMaxRows = 6;  // 24 sums and 4 lines in 32 registers
#elif defined(__AVX512F__)
constexpr int kMaxUnits = 4, kMaxRows = 4;  // 16 sums and 8 widened lines
#elif defined(__AVX2__)
constexpr int kMaxUnits = 1, kMaxRows = 4;  // 8 sums and 4 widened half-lines in 16 (a unit's sums take two)
#else
constexpr int kMaxUnits = 1, kMaxRows = 1;
#endif
// One row of x (one sequence's decode) leaves registers for more units at once: more streams.
#if defined(__AVX2__) && !defined(__AVX512F__)
constexpr int kOneRowUnits = 2;  // 4 sums and 8 widened half-lines
#else
constexpr int kOneRowUnits = kMaxUnits;
#endif

inline void prefetch(const uint16_t* p) {
#if defined(__AVX2__)
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
#else
  __builtin_prefetch(p);
#endif
}

#if defined(__AVX512BF16__)
using XElem = uint16_t;  // x as it comes: vdpbf16ps multiplies bfloat16 pairs
#else
using XElem = float;  // x widened once per call, so that each row's pair is two broadcast loads
#endif

#if defined(__AVX512BF16__)
using Sum = __m512;  // a unit's 16 sums
constexpr int kSums = 1;
using Line = __m512bh;  // 16 features' pair of inputs
using XPair = __m512bh;
inline Line load_line(const uint16_t* line) { return (__m512bh)_mm512_loadu_si512(line); }
inline XPair x_pair(const XElem* x, int64_t p) {
  int32_t pair;  // (x[2p], x[2p+1]) as one 32-bit word, little-endian
  std::memcpy(&pair, x + 2 * p, sizeof pair);
  return (__m512bh)_mm512_set1_epi32(pair);
}
inline void add_pair(Sum* acc, const Line& line, const XPair& x) { acc[0] = _mm512_dpbf16_ps(acc[0], line, x); }
#elif defined(__AVX512F__)
using Sum = __m512;
constexpr int kSums = 1;
struct Line {
  __m512 odd, even;  // each feature's odd input's weight, and its even one's
};
struct XPair {
  __m512 odd, even;
};
inline Line load_line(const uint16_t* line) {
  const __m512i w = _mm512_loadu_si512(line);
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  return {_mm512_castsi512_ps(_mm512_and_si512(w, hi)), _mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
}
inline XPair x_pair(const XElem* x, int64_t p) { return {_mm512_set1_ps(x[2 * p + 1]), _mm512_set1_ps(x[2 * p])}; }
inline void add_pair(Sum* acc, const Line& line, const XPair& x) {
  acc[0] = _mm512_fmadd_ps(line.odd, x.odd, acc[0]);
  acc[0] = _mm512_fmadd_ps(line.even, x.even, acc[0]);
}
#elif defined(__AVX2__)
using Sum = __m256;  // 8 of a unit's 16 sums
constexpr int kSums = 2;
struct Line {
  __m256 odd[2], even[2];  // features 0-7 and 8-15
};
struct XPair {
  __m256 odd, even;
};
inline Line load_line(const uint16_t* line) {
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  Line widened;
  for (int h = 0; h < 2; ++h) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 16 * h));
    widened.odd[h] = _mm256_castsi256_ps(_mm256_and_si256(w, hi));
    widened.even[h] = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  return widened;
}
inline XPair x_pair(const XElem* x, int64_t p) {
  return {_mm256_broadcast_ss(x + 2 * p + 1), _mm256_broadcast_ss(x + 2 * p)};
}
inline void add_pair(Sum* acc, const Line& line, const XPair& x) {
  for (int h = 0; h < 2; ++h) {
    acc[h] = _mm256_fmadd_ps(line.odd[h], x.odd, acc[h]);
    acc[h] = _mm256_fmadd_ps(line.even[h], x.even, acc[h]);
  }
}
#else
struct Sum {
  float f[kUnit];
};
constexpr int kSums = 1;
using Line = const uint16_t*;
struct XPair {
  float odd, even;
};
inline Line load_line(const uint16_t* line) { return line; }
inline XPair x_pair(const XElem* x, int64_t p) { return {x[2 * p + 1], x[2 * p]}; }
// Two passes over the unit's features, the odd inputs' products and then the even ones': each
// pass vectorises across features, and neither reorders a feature's sum.
inline void add_pair(Sum* acc, const Line& line, const XPair& x) {
  for (int64_t f = 0; f < kUnit; ++f) acc->f[f] += argosy_bf16::widen(line[2 * f + 1]) * x.odd;
  for (int64_t f = 0; f < kUnit; ++f) acc->f[f] += argosy_bf16::widen(line[2 * f]) * x.even;
}
#endif

#if defined(__AVX512F__)
inline void store_unit(const Sum* acc, const uint16_t* bias, uint16_t* out) {
  __m512 sum = acc[0];
  if (bias != nullptr) sum = _mm512_add_ps(sum, argosy_bf16::load16(bias));
  argosy_bf16::store16(out, argosy_bf16::round16(sum));
}
#else
inline void store_unit(const Sum* acc, const uint16_t* bias, uint16_t* out) {
  float sums[kUnit];
  std::memcpy(sums, acc, sizeof sums);  // the unit's 16 sums, in feature order
  for (int64_t f = 0; f < kUnit; ++f)
    out[f] = argosy_bf16::narrow(bias == nullptr ? sums[f] : sums[f] + argosy_bf16::widen(bias[f]));
}
#endif

// Sums ROWS rows of x against UNITS units, then writes them (with the bias) as bfloat16.
template <int UNITS, int ROWS>
void tile(const XElem* x, int64_t x_stride, const uint16_t* w, int64_t unit_stride, int64_t pairs,
          const uint16_t* bias, uint16_t* out, int64_t out_stride) {
  Sum acc[ROWS][UNITS][kSums] = {};
  for (int64_t p = 0; p < pairs; ++p) {
    Line lines[UNITS];
    for (int u = 0; u < UNITS; ++u) {
      prefetch(w + u * unit_stride + (p + kAhead) * 2 * kUnit);
      lines[u] = load_line(w + u * unit_stride + p * 2 * kUnit);
    }
    for (int r = 0; r < ROWS; ++r) {
      const XPair xs = x_pair(x + r * x_stride, p);
      for (int u = 0; u < UNITS; ++u) add_pair(acc[r][u], lines[u], xs);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int u = 0; u < UNITS; ++u)
      store_unit(acc[r][u], bias == nullptr ? nullptr : bias + u * kUnit, out + r * out_stride + u * kUnit);
}

template <int UNITS, int ROWS = kMaxRows>
void tile_rows(int rows, const XElem* x, int64_t x_stride, const uint16_t* w, int64_t unit_stride,
               int64_t pairs, const uint16_t* bias, uint16_t* out, int64_t out_stride) {
  if constexpr (ROWS > 1) {
    if (rows < ROWS) return tile_rows<UNITS, ROWS - 1>(rows, x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
  }
  tile<UNITS, ROWS>(x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
}

template <int UNITS = std::max(kMaxUnits, kOneRowUnits)>
void tile_any(int units, int rows, const XElem* x, int64_t x_stride, const uint16_t* w, int64_t unit_stride,
              int64_t pairs, const uint16_t* bias, uint16_t* out, int64_t out_stride) {
  if constexpr (UNITS > 1) {
    if (units < UNITS) return tile_any<UNITS - 1>(units, rows, x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
  }
  tile_rows<UNITS>(rows, x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
}

}  // namespace

// weight [N, K] bfloat16, N a multiple of 16 and K even -> the packed layout above, [N * K].
at::Tensor pack_linear_bf16(const at::Tensor& weight) {
  check_on_cpu("pack_linear_bf16", weight);
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16, "weight: bfloat16 [out, in]");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n % kUnit == 0 && k % 2 == 0, "weight: out a multiple of 16 and in even, not ", n, " x ", k);
  // [N/16, 16, K/2, 2] -> [N/16, K/2, 16, 2]
  return weight.contiguous().view({n / kUnit, kUnit, k / 2, 2}).permute({0, 2, 1, 3}).contiguous().view({-1});
}

// x [M, K] bfloat16 with contiguous rows; packed from pack_linear_bf16 of an [N, K] weight.
at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t n) {
  check_on_cpu("linear_bf16", x, packed);
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.scalar_type() == at::kBFloat16, "x: bfloat16 [rows, in]");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(packed.is_contiguous() && packed.scalar_type() == at::kBFloat16 && packed.numel() == n * k,
              "packed: pack_linear_bf16 of an [", n, ", ", k, "] weight");
  const uint16_t* bias_ptr = nullptr;
  if (bias.has_value()) {
    check_on_cpu("linear_bf16", *bias);
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == n && bias->scalar_type() == at::kBFloat16, "bias: [out]");
    bias_ptr = reinterpret_cast<const uint16_t*>(bias->data_ptr());
  }
  at::Tensor out = cpu_empty({m, n}, x.options());
  const uint16_t* rows_in = reinterpret_cast<const uint16_t*>(x.data_ptr());
  int64_t x_stride = x.stride(0);
#if defined(__AVX512BF16__)
  const XElem* xp = rows_in;
#else
  std::vector<float> widened(m * k);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < k; ++i) widened[r * k + i] = argosy_bf16::widen(rows_in[r * x_stride + i]);
  const XElem* xp = widened.data();
  x_stride = k;
#endif
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t units = n / kUnit, unit_stride = kUnit * k;
  // Units split evenly over the threads; within a thread, a few at a time over every row.
  const int64_t unit_step = m == 1 ? kOneRowUnits : kMaxUnits;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; u += unit_step) {
      const int width = static_cast<int>(std::min<int64_t>(unit_step, end - u));
      for (int64_t r = 0; r < m; r += kMaxRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m - r));
        tile_any(width, rows, xp + r * x_stride, x_stride, wp + u * unit_stride, unit_stride, k / 2,
                 bias_ptr == nullptr ? nullptr : bias_ptr + u * kUnit, op + r * n + u * kUnit, n);
      }
    }
  });
  return out;
}
