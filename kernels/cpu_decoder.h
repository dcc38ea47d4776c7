// The decoder's layers in one call per step on CPU. decoder.py's modules make about ten Python
// calls and views per layer, which on a slow CPU cost one sequence's decode step a sixth of its
// time; this runs the same kernels in the same order from C++, so a step gives the same bits
// either way (server/models/one_call_layers.py decides which layers it may take).
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <vector>

// A linear layer in one of the kernels' formats: bfloat16 pairs (pack_linear_bf16), or int8 units
// (pack_linear_int8) with one float32 scale per output.
struct Projection {
  Projection(at::Tensor weight, c10::optional<at::Tensor> scale, c10::optional<at::Tensor> bias, int64_t out_features)
      : weight(std::move(weight)), scale(std::move(scale)), bias(std::move(bias)), out_features(out_features) {}
  at::Tensor operator()(const at::Tensor& x) const;

  at::Tensor weight;
  c10::optional<at::Tensor> scale;
  c10::optional<at::Tensor> bias;
  int64_t out_features;
};

// One decoder layer's weights: the two norms, Qwen3's per-head q/k norms where it has them, and
// the four projections (q, k and v in one; gate and up in one).
struct LayerWeights {
  at::Tensor input_norm, post_norm;
  c10::optional<at::Tensor> q_norm, k_norm;
  Projection qkv, o, gate_up, down;
};

class CpuDecoder {
 public:
  CpuDecoder(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double scale, at::Tensor cos,
             at::Tensor sin, std::vector<LayerWeights> layers);

  // x: [tokens, hidden] (and the residual stream it has not been added to, after a pipeline stage
  // before this one); kv_cache: [layers, 2, blocks, block_size, kv_heads, head_dim]; decodes:
  // (q_index, block_tables, seq_lens) or nothing; chunks: (q_start, q_len, seq_lens, block_tables)
  // or nothing; together they cover every token. Returns the last layer's output and the residual
  // stream, as DecoderLayer.forward does.
  std::tuple<at::Tensor, at::Tensor> forward(at::Tensor x, c10::optional<at::Tensor> residual,
                                             const at::Tensor& positions, const at::Tensor& kv_cache,
                                             const at::Tensor& slot_mapping, const std::vector<at::Tensor>& decodes,
                                             const std::vector<at::Tensor>& chunks) const;

 private:
  at::Tensor attention(const LayerWeights& w, const at::Tensor& h, const at::Tensor& positions,
                       const at::Tensor& layer_cache, const at::Tensor& slot_mapping,
                       const std::vector<at::Tensor>& decodes, const std::vector<at::Tensor>& chunks) const;

  int64_t heads_, kv_heads_, head_dim_;
  double eps_, scale_;
  at::Tensor cos_, sin_;
  std::vector<LayerWeights> layers_;
};
