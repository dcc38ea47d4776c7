// The Python module of the CPU kernels: one binding per kernel, each defined in its own file.
// torch/csrc/utils/pybind.h: pybind11 with the casters of tensors, a third of torch/extension.h's compile time.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "cpu_decoder.h"
#include "cpu_kernels.h"

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
  namespace py = pybind11;
  // module_local: each level's build is a module of its own, and several load in one process.
  py::class_<Projection>(m, "Projection", "a linear layer in a kernel's format (cpu_decoder.h)", py::module_local())
      .def(py::init<at::Tensor, c10::optional<at::Tensor>, c10::optional<at::Tensor>, int64_t>(), py::arg("weight"),
           py::arg("scale"), py::arg("bias"), py::arg("out_features"));
  py::class_<LayerWeights>(m, "LayerWeights", "one decoder layer's weights (cpu_decoder.h)", py::module_local())
      .def(py::init<at::Tensor, at::Tensor, c10::optional<at::Tensor>, c10::optional<at::Tensor>, Projection,
                    Projection, Projection, Projection>(),
           py::arg("input_norm"), py::arg("post_norm"), py::arg("q_norm"), py::arg("k_norm"), py::arg("qkv"),
           py::arg("o"), py::arg("gate_up"), py::arg("down"));
  py::class_<CpuDecoder>(m, "CpuDecoder", "the decoder's layers in one call per step (cpu_decoder.cpp)", py::module_local())
      .def(py::init<int64_t, int64_t, int64_t, double, double, at::Tensor, at::Tensor, std::vector<LayerWeights>>(),
           py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("eps"), py::arg("scale"),
           py::arg("cos"), py::arg("sin"), py::arg("layers"))
      .def("forward", &CpuDecoder::forward, py::arg("x"), py::arg("residual"), py::arg("positions"),
           py::arg("kv_cache"), py::arg("slot_mapping"), py::arg("decodes"), py::arg("chunks"));
}
