// The decoder's elementwise ops for bfloat16 on CPUs, one pass each instead of the dozen small
// tensor ops of elementwise.py: RMSNorm (with the residual add), rotary embedding and
// SiLU-and-multiply. Each rounds to bfloat16 exactly where the PyTorch reference does, so
// results differ from it only by the float32 summation order inside the norm.

#include <cmath>
#include <cstdint>
#include <tuple>

#include "cpu_bf16.h"
#include "cpu_device.h"

namespace {

using namespace argosy_bf16;

#if defined(__AVX512F__)
// e^x to about 1e-7 relative: 2^n * 2^f with |f| <= 1/2, 2^f by its Taylor polynomial of degree 6.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.f)), _mm512_set1_ps(88.f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.4426950409f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.540353e-4f);
  for (const float c : {1.3333558e-3f, 9.6181291e-3f, 5.5504109e-2f, 0.24022651f, 0.69314718f, 1.f})
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}
#endif

const uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); }
uint16_t* bits_out(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

// Rows of about this many elements or more are worth a second thread.
int64_t grain(int64_t width) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1)); }

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16, name, " must be bfloat16");
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, name, " must be [rows, width] with contiguous rows");
}

}  // namespace

// x, residual: [rows, width]; weight: [width]. Without residual: (rms_norm(x), x); with it:
// (rms_norm(x + residual), x + residual).
std::tuple<at::Tensor, at::Tensor> rms_norm_bf16(const at::Tensor& x, const at::Tensor& weight, double eps,
                                                 const c10::optional<at::Tensor>& residual) {
  check_on_cpu("rms_norm_bf16", x, weight);
  if (residual.has_value()) check_on_cpu("rms_norm_bf16", *residual);
  check_rows(x, "x");
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.is_contiguous(), "weight must be contiguous bfloat16");
  const int64_t rows = x.size(0), width = x.size(1);
  TORCH_CHECK(weight.numel() == width, "weight must have the rows' width");
  at::Tensor out = cpu_empty({rows, width}, x.options());
  at::Tensor h = x;
  if (residual) {
    check_rows(*residual, "residual");
    h = cpu_empty({rows, width}, x.options());
  }
  const uint16_t* xp = bits(x);
  const uint16_t* rp = residual ? bits(*residual) : nullptr;
  const uint16_t* wp = bits(weight);
  uint16_t* hp = residual ? bits_out(h) : nullptr;
  uint16_t* op = bits_out(out);
  const int64_t xs = x.stride(0), rs = residual ? residual->stride(0) : 0;
  at::parallel_for(0, rows, grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* row = xp + r * xs;
      int64_t i = 0;
      if (rp) {  // h = x + residual, rounded as a bfloat16 add
        uint16_t* hrow = hp + r * width;
        const uint16_t* res = rp + r * rs;
#if defined(__AVX512F__)
        for (; i + 16 <= width; i += 16) store16(hrow + i, round16(_mm512_add_ps(load16(row + i), load16(res + i))));
#endif
        for (; i < width; ++i) hrow[i] = narrow(widen(row[i]) + widen(res[i]));
        row = hrow;
      }
      float squares = 0.f;
      i = 0;
#if defined(__AVX512F__)
      __m512 sq = _mm512_setzero_ps();
      for (; i + 16 <= width; i += 16) sq = _mm512_fmadd_ps(load16(row + i), load16(row + i), sq);
      squares = _mm512_reduce_add_ps(sq);
#endif
      for (; i < width; ++i) squares += widen(row[i]) * widen(row[i]);
      const float inv = 1.f / std::sqrt(squares / static_cast<float>(width) + static_cast<float>(eps));
      uint16_t* orow = op + r * width;
      i = 0;
#if defined(__AVX512F__)
      const __m512 vinv = _mm512_set1_ps(inv);
      for (; i + 16 <= width; i += 16)
        store16(orow + i, round16(_mm512_mul_ps(load16(wp + i), round16(_mm512_mul_ps(load16(row + i), vinv)))));
#endif
      for (; i < width; ++i) orow[i] = narrow(widen(wp[i]) * round_bf16(widen(row[i]) * inv));
    }
  });
  return {out, h};
}

// q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim] (each head's vector contiguous);
// cos, sin: float32 [max_position, head_dim], half-split layout. Returns rotated copies.
std::tuple<at::Tensor, at::Tensor> rotary_bf16(const at::Tensor& positions, const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& cos, const at::Tensor& sin) {
  check_on_cpu("rotary_bf16", positions, q, k, cos, sin);
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16, "q and k must be bfloat16");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.stride(2) == 1 && k.stride(2) == 1, "q, k: [tokens, heads, head_dim]");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous(), "float32 tables");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(), "positions must be int64");
  const int64_t tokens = q.size(0), dim = q.size(2), half = dim / 2;
  at::Tensor q_out = cpu_empty(q.sizes(), q.options()), k_out = cpu_empty(k.sizes(), k.options());
  const int64_t* pos = positions.data_ptr<int64_t>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  auto rotate = [&](const at::Tensor& x, at::Tensor& y, int64_t t) {
    const float* c = cp + pos[t] * dim;
    const float* s = sp + pos[t] * dim;
    for (int64_t head = 0; head < x.size(1); ++head) {
      const uint16_t* in = bits(x) + t * x.stride(0) + head * x.stride(1);
      uint16_t* o = bits_out(y) + (t * y.size(1) + head) * dim;
      // x * cos + cat(-x2, x1) * sin, each product and the sum rounded, the tables first.
      int64_t d = 0;
#if defined(__AVX512F__)
      if (half % 16 == 0) {
        const __m512 sign = _mm512_set1_ps(-0.f);
        for (; d < dim; d += 16) {
          const __m512 other = load16(d < half ? in + d + half : in + d - half);
          const __m512 rot = d < half ? _mm512_xor_ps(other, sign) : other;
          const __m512 a = round16(_mm512_mul_ps(load16(in + d), round16(_mm512_loadu_ps(c + d))));
          const __m512 b = round16(_mm512_mul_ps(rot, round16(_mm512_loadu_ps(s + d))));
          store16(o + d, round16(_mm512_add_ps(a, b)));
        }
      }
#endif
      for (; d < dim; ++d) {
        const float rot = d < half ? -widen(in[d + half]) : widen(in[d - half]);
        o[d] = narrow(round_bf16(widen(in[d]) * round_bf16(c[d])) + round_bf16(rot * round_bf16(s[d])));
      }
    }
  };
  at::parallel_for(0, tokens, grain(dim * (q.size(1) + k.size(1))), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) rotate(q, q_out, t), rotate(k, k_out, t);
  });
  return {q_out, k_out};
}

// x: [rows, 2 * I] (gate, then up) -> silu(gate) * up: [rows, I].
at::Tensor silu_and_mul_bf16(const at::Tensor& x) {
  check_on_cpu("silu_and_mul_bf16", x);
  check_rows(x, "x");
  const int64_t rows = x.size(0), width = x.size(1) / 2;
  at::Tensor out = cpu_empty({rows, width}, x.options());
  const uint16_t* xp = bits(x);
  uint16_t* op = bits_out(out);
  const int64_t xs = x.stride(0);
  at::parallel_for(0, rows, grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* gate = xp + r * xs;
      const uint16_t* up = gate + width;
      uint16_t* o = op + r * width;
      int64_t i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= width; i += 16) {
        const __m512 g = load16(gate + i);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        const __m512 silu = round16(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)));
        store16(o + i, round16(_mm512_mul_ps(silu, load16(up + i))));
      }
#endif
      for (; i < width; ++i) {
        const float g = widen(gate[i]);
        o[i] = narrow(round_bf16(g / (1.f + std::exp(-g))) * widen(up[i]));
      }
    }
  });
  return out;
}
