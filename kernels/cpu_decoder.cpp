// The one-call decoder (cpu_decoder.h): decoder.py's Attention and DecoderLayer, kernel for kernel.
#include "cpu_decoder.h"

#include "cpu_device.h"
#include "cpu_kernels.h"

at::Tensor Projection::operator()(const at::Tensor& x) const {
  return scale ? linear_int8(x, weight, *scale, bias, out_features) : linear_bf16(x, weight, bias, out_features);
}

namespace {

// elementwise.rms_norm's reference, op for op: what the modules run for the per-head q/k norms.
at::Tensor head_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor x32 = x.to(at::kFloat);
  x32 = x32.mul(x32.pow(2).mean({-1}, /*keepdim=*/true).add(eps).rsqrt());
  return weight.mul(x32.to(x.scalar_type()));
}

}  // namespace

CpuDecoder::CpuDecoder(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double scale, at::Tensor cos,
                       at::Tensor sin, std::vector<LayerWeights> layers)
    : heads_(heads),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      eps_(eps),
      scale_(scale),
      cos_(std::move(cos)),
      sin_(std::move(sin)),
      layers_(std::move(layers)) {
  TORCH_CHECK(!layers_.empty(), "a decoder of no layers");
  for (const LayerWeights& w : layers_)
    TORCH_CHECK(w.q_norm.has_value() == w.k_norm.has_value(), "a layer has both q and k norms or neither");
}

at::Tensor CpuDecoder::attention(const LayerWeights& w, const at::Tensor& h, const at::Tensor& positions,
                                 const at::Tensor& layer_cache, const at::Tensor& slot_mapping,
                                 const std::vector<at::Tensor>& decodes, const std::vector<at::Tensor>& chunks) const {
  const int64_t q_size = heads_ * head_dim_, kv_size = kv_heads_ * head_dim_;
  const at::Tensor qkv = w.qkv(h);
  at::Tensor q = qkv.narrow(1, 0, q_size).view({-1, heads_, head_dim_});
  at::Tensor k = qkv.narrow(1, q_size, kv_size).view({-1, kv_heads_, head_dim_});
  const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({-1, kv_heads_, head_dim_});
  if (w.q_norm) q = head_norm(q, *w.q_norm, eps_), k = head_norm(k, *w.k_norm, eps_);
  std::tie(q, k) = rotary_bf16(positions, q, k, cos_, sin_);
  at::Tensor k_cache = layer_cache.select(0, 0), v_cache = layer_cache.select(0, 1);
  write_kv(k, v, k_cache, v_cache, slot_mapping);
  at::Tensor out = cpu_empty({q.size(0), q_size}, q.options());
  at::Tensor heads_out = out.view(q.sizes());
  if (!decodes.empty())
    paged_decode_attention(q, k_cache, v_cache, decodes[0], decodes[1], decodes[2], scale_, heads_out);
  if (!chunks.empty())
    paged_chunk_attention(q, k_cache, v_cache, chunks[0], chunks[1], chunks[2], chunks[3], scale_, heads_out);
  return w.o(out);
}

std::tuple<at::Tensor, at::Tensor> CpuDecoder::forward(at::Tensor x, c10::optional<at::Tensor> residual,
                                                       const at::Tensor& positions, const at::Tensor& kv_cache,
                                                       const at::Tensor& slot_mapping,
                                                       const std::vector<at::Tensor>& decodes,
                                                       const std::vector<at::Tensor>& chunks) const {
  check_on_cpu("CpuDecoder.forward", x, positions, kv_cache, slot_mapping);
  TORCH_CHECK(kv_cache.size(0) == static_cast<int64_t>(layers_.size()), "kv_cache: one entry per layer, ",
              layers_.size(), " layers, not ", kv_cache.size(0));
  TORCH_CHECK(decodes.empty() || decodes.size() == 3, "decodes: (q_index, block_tables, seq_lens) or nothing");
  TORCH_CHECK(chunks.empty() || chunks.size() == 4, "chunks: (q_start, q_len, seq_lens, block_tables) or nothing");
  at::Tensor h, stream;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerWeights& w = layers_[i];
    std::tie(h, stream) = rms_norm_bf16(x, w.input_norm, eps_, residual);
    h = attention(w, h, positions, kv_cache.select(0, static_cast<int64_t>(i)), slot_mapping, decodes, chunks);
    std::tie(h, stream) = rms_norm_bf16(h, w.post_norm, eps_, stream);
    residual = stream;
    x = w.down(silu_and_mul_bf16(w.gate_up(h)));
  }
  return {x, *residual};
}
