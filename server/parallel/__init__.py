"""Tensor parallelism within a node: each rank holds a slice of every layer's heads and MLP."""
