// The CPU kernels' entry points, each defined in its own file: for the Python bindings and for
// the one-call decoder (cpu_decoder.cpp), which runs them in sequence.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <vector>

void paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& q_index, const at::Tensor& block_tables,
                            const at::Tensor& seq_lens, double scale, at::Tensor& out);
void paged_chunk_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& q_start, const at::Tensor& q_len, const at::Tensor& seq_lens,
                           const at::Tensor& block_tables, double scale, at::Tensor& out);
at::Tensor greedy_argmax(const at::Tensor& logits);
std::tuple<at::Tensor, at::Tensor> rms_norm_bf16(const at::Tensor& x, const at::Tensor& weight, double eps,
                                                 const c10::optional<at::Tensor>& residual);
std::tuple<at::Tensor, at::Tensor> rotary_bf16(const at::Tensor& positions, const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& cos, const at::Tensor& sin);
at::Tensor silu_and_mul_bf16(const at::Tensor& x);
void write_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slot_mapping);
void apply_token_bitmask(at::Tensor& logits, const at::Tensor& bitmask, const at::Tensor& rows);
at::Tensor pack_linear_bf16(const at::Tensor& weight);
at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t n);
at::Tensor pack_linear_int8(const at::Tensor& weight);
at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias, int64_t n);
void lora_runs(const at::Tensor& x, at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
               const std::vector<int64_t>& bounds, const at::Tensor& runs);
