"""What touches the device: the model runner (a step's inputs, the forward pass, the KV-cache
tensor) and the sampler."""
