// Weight-only int8 linear layers on CPUs: out = (x Q^T) * scale (+ b), Q the weight in int8 with
// one float32 scale per output feature, quantized once at load (server/models/int8_linear.py).
//
// A decode step reads every weight once for a few rows of x: int8 weights halve the bytes that
// bound it. The layout is units of 16 output features, each unit [K][16]: 16 bytes per input, one
// feature's weights 16 bytes apart. Each step widens a unit's line to 16 float32 (an int8 value is
// exact in float32) and multiply-adds it with one input of x, also widened (a product of an int8
// and a bfloat16 is exact in float32, so a fused multiply-add rounds as the add does): per output,
// over the inputs in order, the same sums at every instruction-set level. x stays floating point:
// no activation quantization, so the int8 weights are the only rounding added to bfloat16's.
#include "cpu_linear_tile.h"

namespace {

using argosy_linear::kUnit;
using argosy_linear::Sum;

struct Int8Lines {
  using Weight = int8_t;
  using XElem = float;
  static constexpr int64_t kLineElems = kUnit;
#if defined(__AVX512F__)
  static constexpr int kUnits = 4, kRows = 6, kOneRowUnits = 4;  // 24 sums and 4 lines in 32 registers
  using Line = __m512;
  using XVal = __m512;
  static Line load(const Weight* line) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(line))));
  }
  static XVal x_at(const XElem* x, int64_t k) { return _mm512_set1_ps(x[k]); }
  static void add(Sum* acc, const Line& line, const XVal& x) { acc[0] = _mm512_fmadd_ps(line, x, acc[0]); }
#elif defined(__AVX2__)
  // 12 sums, 2 half-lines and x in 16 registers: six rows widen each line once (a speculative
  // step's five rows in one pass).
  static constexpr int kUnits = 1, kRows = 6, kOneRowUnits = 2;
  struct Line {
    __m256 half[2];  // features 0-7 and 8-15
  };
  using XVal = __m256;
  static Line load(const Weight* line) {
    Line widened;
    for (int h = 0; h < 2; ++h) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(line + 8 * h));
      widened.half[h] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    }
    return widened;
  }
  static XVal x_at(const XElem* x, int64_t k) { return _mm256_broadcast_ss(x + k); }
  static void add(Sum* acc, const Line& line, const XVal& x) {
    for (int h = 0; h < 2; ++h) acc[h] = _mm256_fmadd_ps(line.half[h], x, acc[h]);
  }
#else
  static constexpr int kUnits = 1, kRows = 1, kOneRowUnits = 1;
  using Line = const Weight*;
  using XVal = float;
  static Line load(const Weight* line) { return line; }
  static XVal x_at(const XElem* x, int64_t k) { return x[k]; }
  static void add(Sum* acc, const Line& line, const XVal& x) {
    for (int64_t f = 0; f < kUnit; ++f) acc->f[f] += static_cast<float>(line[f]) * x;
  }
#endif
};

}  // namespace

// weight [N, K] int8, N a multiple of 16 -> the layout above, [N * K].
at::Tensor pack_linear_int8(const at::Tensor& weight) {
  check_on_cpu("pack_linear_int8", weight);
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kChar, "weight: int8 [out, in]");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n % kUnit == 0, "weight: out a multiple of 16, not ", n);
  // [N/16, 16, K] -> [N/16, K, 16]
  return weight.contiguous().view({n / kUnit, kUnit, k}).permute({0, 2, 1}).contiguous().view({-1});
}

// x [M, K] bfloat16 with contiguous rows; packed from pack_linear_int8 of an [N, K] weight; scale
// [N] float32.
at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias, int64_t n) {
  check_on_cpu("linear_int8", x, packed, scale);
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.scalar_type() == at::kBFloat16, "x: bfloat16 [rows, in]");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(packed.is_contiguous() && packed.scalar_type() == at::kChar && packed.numel() == n * k,
              "packed: pack_linear_int8 of an [", n, ", ", k, "] weight");
  TORCH_CHECK(scale.is_contiguous() && scale.scalar_type() == at::kFloat && scale.numel() == n,
              "scale: float32 [out]");
  at::Tensor out = cpu_empty({m, n}, x.options());
  const std::vector<float> widened =
      argosy_linear::widened_rows(reinterpret_cast<const uint16_t*>(x.data_ptr()), m, k, x.stride(0));
  const argosy_linear::Operands<Int8Lines> o{widened.data(),
                                             k,
                                             reinterpret_cast<const int8_t*>(packed.data_ptr()),
                                             kUnit * k,
                                             k,
                                             scale.data_ptr<float>(),
                                             argosy_linear::bias_data("linear_int8", bias, n),
                                             reinterpret_cast<uint16_t*>(out.data_ptr()),
                                             n};
  argosy_linear::product(m, n, o);
  return out;
}
