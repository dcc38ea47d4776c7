"""Argosy: a paged, continuous-batching LLM inference server and the Kubernetes operator
that runs fleets of it."""
from argosy.server.llm import LLM
from argosy.server.outputs import CompletionOutput, RequestOutput
from argosy.server.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]
