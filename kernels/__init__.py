"""Attention and cache kernels: pure-PyTorch references (the CPU path) and, where a GPU
is present, Triton kernels that must match them."""
