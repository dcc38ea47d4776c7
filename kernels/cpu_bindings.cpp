// The Python module of the CPU kernels: one binding per kernel, each defined in its own file.
#include <torch/extension.h>

void paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& q_index, const at::Tensor& block_tables,
                            const at::Tensor& seq_lens, double scale, at::Tensor& out);
at::Tensor greedy_argmax(const at::Tensor& logits);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "paged decode attention (cpu_attention.cpp)");
  m.def("greedy_argmax", &greedy_argmax, "each row's first maximum (cpu_argmax.cpp)");
}
