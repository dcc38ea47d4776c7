// The first check of every CPU kernel's entry point: its tensors are in host memory. A CUDA
// tensor's data read as host memory would crash the process; this raises a clear error instead.
#pragma once

// The ATen headers the kernels need and no more, as each kernel is compiled once per level:
// torch/extension.h (pybind11, the C++ frontend) takes 20 s a file, ATen/ops/empty.h 3 s, these 1 s.
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

template <typename... Tensors>
inline void check_on_cpu(const char* kernel, const Tensors&... tensors) {
  for (const at::Tensor* t : {&tensors...})
    TORCH_CHECK(t->device().is_cpu(), kernel, " is a CPU kernel: it was given a tensor on ", t->device());
}

// A new uninitialised CPU tensor (at::empty without the operator headers).
inline at::Tensor cpu_empty(at::IntArrayRef size, const at::TensorOptions& options) {
  return at::Tensor(at::detail::empty_cpu(size, options));
}
