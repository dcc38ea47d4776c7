// The Python module of the CPU kernels: one binding per kernel, each defined in its own file.
// torch/csrc/utils/pybind.h: pybind11 with the casters of tensors, a third of torch/extension.h's compile time.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

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

#define ARGOSY_STRING_OF(tokens) #tokens
#define ARGOSY_STRING(macro) ARGOSY_STRING_OF(macro)

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // What the build was made from and for: a build made at install is used only while both hold.
  m.attr("sources_digest") = ARGOSY_STRING(ARGOSY_SOURCES_DIGEST);
  m.attr("torch_version") = ARGOSY_STRING(ARGOSY_TORCH_VERSION);
  m.def("paged_decode_attention", &paged_decode_attention, "paged decode attention (cpu_attention.cpp)");
  m.def("paged_chunk_attention", &paged_chunk_attention, "paged attention of query chunks (cpu_chunk_attention.cpp)");
  m.def("greedy_argmax", &greedy_argmax, "each row's first maximum (cpu_argmax.cpp)");
  m.def("rms_norm_bf16", &rms_norm_bf16, "RMSNorm with the residual add (cpu_elementwise.cpp)");
  m.def("rotary_bf16", &rotary_bf16, "rotary embedding (cpu_elementwise.cpp)");
  m.def("silu_and_mul_bf16", &silu_and_mul_bf16, "SiLU-and-multiply (cpu_elementwise.cpp)");
  m.def("write_kv", &write_kv, "new keys and values into the paged cache (cpu_kv_cache.cpp)");
  m.def("apply_token_bitmask", &apply_token_bitmask, "a grammar's masks on logits rows (cpu_bitmask.cpp)");
  m.def("pack_linear_bf16", &pack_linear_bf16, "a bfloat16 weight into pairs of inputs (cpu_linear.cpp)");
  m.def("linear_bf16", &linear_bf16, "x W^T (+ b) over a paired weight (cpu_linear.cpp)");
  m.def("pack_linear_int8", &pack_linear_int8, "an int8 weight into units of 16 outputs (cpu_linear_int8.cpp)");
  m.def("linear_int8", &linear_int8, "x Q^T * scale (+ b) over an int8 weight (cpu_linear_int8.cpp)");
  m.def("lora_runs", &lora_runs, "a step's LoRA products for one layer, a run of one adapter at a time (cpu_lora.cpp)");
}
