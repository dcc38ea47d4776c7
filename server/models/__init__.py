"""Checkpoints and the model built from them: ModelConfig, reading safetensors, the embedded
default model, the decoder shared by every supported architecture, and weight loading."""
