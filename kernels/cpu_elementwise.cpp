// The decoder's elementwise ops for bfloat16 on CPUs, one pass each instead of the dozen small
// tensor ops of elementwise.py: RMSNorm (with the residual add), rotary embedding and
// SiLU-and-multiply. Each rounds to bfloat16 exactly where the PyTorch reference does, so
// results differ from it only by the float32 summation order inside the norm.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>

namespace {

inline float widen(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, as PyTorch's float -> bfloat16 conversion.
inline uint16_t narrow(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

inline float round_bf16(float f) { return widen(narrow(f)); }

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
  check_rows(x, "x");
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.is_contiguous(), "weight must be contiguous bfloat16");
  const int64_t rows = x.size(0), width = x.size(1);
  TORCH_CHECK(weight.numel() == width, "weight must have the rows' width");
  at::Tensor out = at::empty({rows, width}, x.options());
  at::Tensor h = x;
  if (residual) {
    check_rows(*residual, "residual");
    h = at::empty({rows, width}, x.options());
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
      if (rp) {  // h = x + residual, rounded as a bfloat16 add
        uint16_t* hrow = hp + r * width;
        const uint16_t* res = rp + r * rs;
        for (int64_t i = 0; i < width; ++i) hrow[i] = narrow(widen(row[i]) + widen(res[i]));
        row = hrow;
      }
      float squares = 0.f;
      for (int64_t i = 0; i < width; ++i) squares += widen(row[i]) * widen(row[i]);
      const float inv = 1.f / std::sqrt(squares / static_cast<float>(width) + static_cast<float>(eps));
      uint16_t* orow = op + r * width;
      for (int64_t i = 0; i < width; ++i) orow[i] = narrow(widen(wp[i]) * round_bf16(widen(row[i]) * inv));
    }
  });
  return {out, h};
}

// q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim] (each head's vector contiguous);
// cos, sin: float32 [max_position, head_dim], half-split layout. Returns rotated copies.
std::tuple<at::Tensor, at::Tensor> rotary_bf16(const at::Tensor& positions, const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16, "q and k must be bfloat16");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.stride(2) == 1 && k.stride(2) == 1, "q, k: [tokens, heads, head_dim]");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous(), "float32 tables");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(), "positions must be int64");
  const int64_t tokens = q.size(0), dim = q.size(2), half = dim / 2;
  at::Tensor q_out = at::empty(q.sizes(), q.options()), k_out = at::empty(k.sizes(), k.options());
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
      for (int64_t d = 0; d < dim; ++d) {
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
  check_rows(x, "x");
  const int64_t rows = x.size(0), width = x.size(1) / 2;
  at::Tensor out = at::empty({rows, width}, x.options());
  const uint16_t* xp = bits(x);
  uint16_t* op = bits_out(out);
  const int64_t xs = x.stride(0);
  at::parallel_for(0, rows, grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* gate = xp + r * xs;
      const uint16_t* up = gate + width;
      uint16_t* o = op + r * width;
      for (int64_t i = 0; i < width; ++i) {
        const float g = widen(gate[i]);
        o[i] = narrow(round_bf16(g / (1.f + std::exp(-g))) * widen(up[i]));
      }
    }
  });
  return out;
}
