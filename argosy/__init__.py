"""Argosy: a paged, continuous-batching LLM inference server and the Kubernetes operator
that runs fleets of it.

The public names are imported on first use, so that `argosy operator` and the CLI's start-up
never load torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = [
    "LLM",
    "CompletionOutput",
    "LoRARequest",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
    "__version__",
]

_EXPORTS = {
    "LLM": "argosy.server.llm",
    "SamplingParams": "argosy.server.sampling_params",
    "RequestOutput": "argosy.server.outputs",
    "CompletionOutput": "argosy.server.outputs",
    "LoRARequest": "argosy.server.lora.request",
    "StructuredOutputsParams": "argosy.server.structured.params",
}

if TYPE_CHECKING:
    from argosy.server.llm import LLM
    from argosy.server.lora.request import LoRARequest
    from argosy.server.outputs import CompletionOutput, RequestOutput
    from argosy.server.sampling_params import SamplingParams
    from argosy.server.structured.params import StructuredOutputsParams


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'argosy' has no attribute {name!r}")
