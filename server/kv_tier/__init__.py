"""The KV cache's second tier: full blocks kept in host memory, found by their chained hashes."""
