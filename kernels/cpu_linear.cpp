// bfloat16 linear layers on CPUs with AVX512-BF16: out = x W^T (+ b), W packed once at load.
//
// A decode step reads every weight once for a few rows of x, so the product is bound by memory
// bandwidth; oneDNN reaches about half of it at one row here. The packed layout is units of 16
// output features, each unit [K/2][16][2]: one 64-byte line holds 16 features' pair of
// consecutive inputs, what one vdpbf16ps multiplies by a broadcast pair of x. A unit is one
// contiguous stream; four are read at once, so one row of x keeps four independent sums going,
// each prefetched 2 KiB ahead (a speculative step's 5 rows ran 15% faster with it, one row the
// same). Up to six rows share each line read: a step of 5 verification rows is one pass.
//
// Each output row is summed in one fixed order (over k pairs, in float32) whatever the number
// of rows: a row's result does not depend on the rows beside it, as a speculative step's
// verification rows must equal the decode steps they stand for.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "cpu_bf16.h"
#include "cpu_device.h"

namespace {

constexpr int64_t kUnit = 16;  // output features per unit: one vector of float32 sums
constexpr int kMaxUnits = 4;   // units read at once
constexpr int64_t kAhead = 32;  // pairs prefetched ahead: 32 lines of 64 bytes
constexpr int kMaxRows = 6;    // rows of x summed at once (registers: 6 x 4 sums); more take more passes

#if defined(__AVX512BF16__)
// Sums ROWS rows of x against UNITS units, then writes them (with the bias) as bfloat16.
template <int UNITS, int ROWS>
void tile(const uint16_t* x, int64_t x_stride, const uint16_t* w, int64_t unit_stride, int64_t pairs,
          const uint16_t* bias, uint16_t* out, int64_t out_stride) {
  __m512 acc[ROWS][UNITS];
  for (int r = 0; r < ROWS; ++r)
    for (int u = 0; u < UNITS; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh lines[UNITS];
    for (int u = 0; u < UNITS; ++u)
      _mm_prefetch(reinterpret_cast<const char*>(w + u * unit_stride + (p + kAhead) * 2 * kUnit), _MM_HINT_T0);
    for (int u = 0; u < UNITS; ++u)
      lines[u] = (__m512bh)_mm512_loadu_si512(reinterpret_cast<const void*>(w + u * unit_stride + p * 2 * kUnit));
    for (int r = 0; r < ROWS; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * x_stride + 2 * p, sizeof pair);
      const __m512bh xs = (__m512bh)_mm512_set1_epi32(pair);
      for (int u = 0; u < UNITS; ++u) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], lines[u], xs);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int u = 0; u < UNITS; ++u) {
      __m512 sum = acc[r][u];
      if (bias != nullptr) sum = _mm512_add_ps(sum, argosy_bf16::load16(bias + u * kUnit));
      argosy_bf16::store16(out + r * out_stride + u * kUnit, argosy_bf16::round16(sum));
    }
}

template <int UNITS>
void tile_rows(int rows, const uint16_t* x, int64_t x_stride, const uint16_t* w, int64_t unit_stride,
               int64_t pairs, const uint16_t* bias, uint16_t* out, int64_t out_stride) {
  switch (rows) {
    case 1: return tile<UNITS, 1>(x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
    case 2: return tile<UNITS, 2>(x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
    case 3: return tile<UNITS, 3>(x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
    case 4: return tile<UNITS, 4>(x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
    case 5: return tile<UNITS, 5>(x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
    default: return tile<UNITS, 6>(x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
  }
}

void tile_any(int units, int rows, const uint16_t* x, int64_t x_stride, const uint16_t* w, int64_t unit_stride,
              int64_t pairs, const uint16_t* bias, uint16_t* out, int64_t out_stride) {
  switch (units) {
    case 1: return tile_rows<1>(rows, x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
    case 2: return tile_rows<2>(rows, x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
    case 3: return tile_rows<3>(rows, x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
    default: return tile_rows<4>(rows, x, x_stride, w, unit_stride, pairs, bias, out, out_stride);
  }
}
#endif

}  // namespace

bool packed_linear_supported() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

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
  TORCH_CHECK(packed_linear_supported(), "linear_bf16 needs a CPU with AVX512-BF16");
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
  at::Tensor out = at::empty({m, n}, x.options());
#if defined(__AVX512BF16__)
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t units = n / kUnit, unit_stride = kUnit * k, x_stride = x.stride(0);
  // Units split evenly over the threads; within a thread, four at a time over every row.
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; u += kMaxUnits) {
      const int width = static_cast<int>(std::min<int64_t>(kMaxUnits, end - u));
      for (int64_t r = 0; r < m; r += kMaxRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m - r));
        tile_any(width, rows, xp + r * x_stride, x_stride, wp + u * unit_stride, unit_stride, k / 2,
                 bias_ptr == nullptr ? nullptr : bias_ptr + u * kUnit, op + r * n + u * kUnit, n);
      }
    }
  });
#endif
  return out;
}
