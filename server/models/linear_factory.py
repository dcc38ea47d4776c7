"""LinearFactory: the one place that decides each linear layer's weight format, from the
configuration and the device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from argosy.server.models.fp8 import Fp8Linear
from argosy.server.models.int8_linear import Int8Linear
from argosy.server.models.linear import Linear, Role
from argosy.server.models.packed_linear import PackedLinear, packing_supported
from argosy.server.models.paired_linear import PairedLinear, pairing_fits, pairing_supported


@dataclass(frozen=True)
class LinearFactory:
    """Which format each linear layer of the model takes. With FP8, the decoder layers'
    projections (the LM head stays in the model dtype, as in vLLM); with int8, every layer, a
    tied LM head included (as llama.cpp's Q8_0); on CPUs that support it,
    every layer paired for Argosy's bfloat16 kernel where its shape fits, else packed by oneDNN,
    a tied LM head included (it gets a copy of the embeddings in that format)."""

    quantization: str | None = None
    packed: bool = False
    paired: bool = False

    @classmethod
    def for_device(cls, quantization: str | None, device: torch.device, dtype: torch.dtype) -> LinearFactory:
        plain = quantization is None
        return cls(quantization, plain and packing_supported(device, dtype), plain and pairing_supported(device, dtype))

    def layer_class(self, role: Role, in_features: int, out_features: int) -> type[Linear]:
        if self.quantization == "fp8":
            return Linear if role == "lm_head" else Fp8Linear
        if self.quantization == "int8":
            return Int8Linear
        if self.paired and pairing_fits(in_features, out_features):
            return PairedLinear
        if self.packed:
            return PackedLinear
        return Linear

    def __call__(self, role: Role, in_features: int, out_features: int, bias: bool = False) -> Linear:
        return self.layer_class(role, in_features, out_features)(in_features, out_features, bias)

    def tied_head(self, embeddings: torch.Tensor) -> Linear | None:
        """The LM head of a model whose head is its embeddings, when the format wants a layer
        of its own for it (None: the logits are a product with the embeddings themselves)."""
        vocab, hidden = embeddings.shape
        head = self.layer_class("lm_head", hidden, vocab)
        return None if head is Linear else head.from_weight(embeddings.detach())


PLAIN = LinearFactory()
