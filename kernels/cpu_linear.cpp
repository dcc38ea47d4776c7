// bfloat16 linear layers on CPUs: out = x W^T (+ b), W packed once at load.
//
// A decode step reads every weight once for a few rows of x, so the product is bound by memory
// bandwidth; oneDNN reaches about half of it at one row here. The packed layout is units of 16
// output features, each unit [K/2][16][2]: one 64-byte line holds 16 features' pair of
// consecutive inputs, what one AVX512-BF16 vdpbf16ps multiplies by a broadcast pair of x
// (cpu_linear_tile.h reads the units; a speculative step's 5 rows ran 15% faster with its
// prefetch, one row the same).
//
// One product per instruction-set level, all over the same layout and with the same sums: per
// output, over the input pairs in order, the odd input's product and then the even one's, each
// added to a float32 sum, as vdpbf16ps defines them (a product of two bfloat16 values is exact in
// float32, so a fused multiply-add rounds as that add does). AVX512-BF16 multiplies the pairs;
// AVX-512 and AVX2 widen them (a bfloat16 is the top half of a float32) and multiply-add 16 or 8
// features at a time; the portable product does the same a feature at a time.
#include "cpu_linear_tile.h"

namespace {

using argosy_linear::kUnit;
using argosy_linear::Sum;

struct Bf16Pairs {
  using Weight = uint16_t;
  static constexpr int64_t kLineElems = 2 * kUnit;
#if defined(__AVX512BF16__)
  using XElem = uint16_t;  // x as it comes: vdpbf16ps multiplies bfloat16 pairs
  static constexpr int kUnits = 4, kRows = 6, kOneRowUnits = 4;  // 24 sums and 4 lines in 32 registers
  using Line = __m512bh;
  using XVal = __m512bh;
  static Line load(const Weight* line) { return (__m512bh)_mm512_loadu_si512(line); }
  static XVal x_at(const XElem* x, int64_t p) {
    int32_t pair;  // (x[2p], x[2p+1]) as one 32-bit word, little-endian
    std::memcpy(&pair, x + 2 * p, sizeof pair);
    return (__m512bh)_mm512_set1_epi32(pair);
  }
  static void add(Sum* acc, const Line& line, const XVal& x) { acc[0] = _mm512_dpbf16_ps(acc[0], line, x); }
#elif defined(__AVX512F__)
  using XElem = float;  // x widened once per call, so that each row's pair is two broadcast loads
  static constexpr int kUnits = 4, kRows = 4, kOneRowUnits = 4;  // 16 sums and 8 widened lines
  struct Line {
    __m512 odd, even;  // each feature's odd input's weight, and its even one's
  };
  struct XVal {
    __m512 odd, even;
  };
  static Line load(const Weight* line) {
    const __m512i w = _mm512_loadu_si512(line);
    const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    return {_mm512_castsi512_ps(_mm512_and_si512(w, hi)), _mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
  }
  static XVal x_at(const XElem* x, int64_t p) { return {_mm512_set1_ps(x[2 * p + 1]), _mm512_set1_ps(x[2 * p])}; }
  static void add(Sum* acc, const Line& line, const XVal& x) {
    acc[0] = _mm512_fmadd_ps(line.odd, x.odd, acc[0]);
    acc[0] = _mm512_fmadd_ps(line.even, x.even, acc[0]);
  }
#elif defined(__AVX2__)
  using XElem = float;
  // 8 sums and 4 widened half-lines in 16 registers (a unit's sums take two); one row leaves
  // room for two units: more streams.
  static constexpr int kUnits = 1, kRows = 5, kOneRowUnits = 2;
  struct Line {
    __m256 odd[2], even[2];  // features 0-7 and 8-15
  };
  struct XVal {
    __m256 odd, even;
  };
  static Line load(const Weight* line) {
    const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    Line widened;
    for (int h = 0; h < 2; ++h) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 16 * h));
      widened.odd[h] = _mm256_castsi256_ps(_mm256_and_si256(w, hi));
      widened.even[h] = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    return widened;
  }
  static XVal x_at(const XElem* x, int64_t p) {
    return {_mm256_broadcast_ss(x + 2 * p + 1), _mm256_broadcast_ss(x + 2 * p)};
  }
  static void add(Sum* acc, const Line& line, const XVal& x) {
    for (int h = 0; h < 2; ++h) {
      acc[h] = _mm256_fmadd_ps(line.odd[h], x.odd, acc[h]);
      acc[h] = _mm256_fmadd_ps(line.even[h], x.even, acc[h]);
    }
  }
#else
  using XElem = float;
  // Four rows share each line read (a speculative step's five rows in two passes, not five).
  static constexpr int kUnits = 1, kRows = 4, kOneRowUnits = 1;
  using Line = const Weight*;
  struct XVal {
    float odd, even;
  };
  static Line load(const Weight* line) { return line; }
  static XVal x_at(const XElem* x, int64_t p) { return {x[2 * p + 1], x[2 * p]}; }
  // Two passes over the unit's features, the odd inputs' products and then the even ones': each
  // pass vectorises across features, and neither reorders a feature's sum.
  static void add(Sum* acc, const Line& line, const XVal& x) {
    for (int64_t f = 0; f < kUnit; ++f) acc->f[f] += argosy_bf16::widen(line[2 * f + 1]) * x.odd;
    for (int64_t f = 0; f < kUnit; ++f) acc->f[f] += argosy_bf16::widen(line[2 * f]) * x.even;
  }
#endif
};

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
  const uint16_t* bias_ptr = argosy_linear::bias_data("linear_bf16", bias, n);
  at::Tensor out = cpu_empty({m, n}, x.options());
  const uint16_t* rows_in = reinterpret_cast<const uint16_t*>(x.data_ptr());
  argosy_linear::Operands<Bf16Pairs> o{nullptr, x.stride(0), reinterpret_cast<const uint16_t*>(packed.data_ptr()),
                                       kUnit * k, k / 2, nullptr, bias_ptr,
                                       reinterpret_cast<uint16_t*>(out.data_ptr()), n};
#if defined(__AVX512BF16__)
  o.x = rows_in;
#else
  const std::vector<float> widened = argosy_linear::widened_rows(rows_in, m, k, x.stride(0));
  o.x = widened.data();
  o.x_stride = k;
#endif
  argosy_linear::product(m, n, o);
  return out;
}
