// The first check of every CPU kernel's entry point: its tensors are in host memory. A CUDA
// tensor's data read as host memory would crash the process; this raises a clear error instead.
#pragma once

#include <torch/extension.h>

template <typename... Tensors>
inline void check_on_cpu(const char* kernel, const Tensors&... tensors) {
  for (const at::Tensor* t : {&tensors...})
    TORCH_CHECK(t->device().is_cpu(), kernel, " is a CPU kernel: it was given a tensor on ", t->device());
}
