"""The inference server: paged KV cache, continuous-batching scheduler, model runner,
sampler, checkpoint loading and the offline `LLM` API."""
