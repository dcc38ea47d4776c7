"""Prefill/decode disaggregation: KV blocks handed from a prefill replica to a decode replica."""
