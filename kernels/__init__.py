"""Paged attention and KV-cache operations in pure PyTorch: the CPU path, and the reference
that any GPU kernel must match."""
