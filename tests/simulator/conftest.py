from __future__ import annotations

import pytest

from argosy.operator.spec import InferenceServiceSpec
from argosy.server.profile.engine_profile import EngineProfile, EngineSettings, FitQuality
from tests.checkpoints import build_checkpoint

# A replica of this profile: 10 ms per step, 0.5 ms per prompt token, 1 ms per decode.
COEFFICIENTS = {
    "steps": 0.010,
    "prefill_tokens": 0.0005,
    "prefill_attention": 0.0,
    "decode_seqs": 0.001,
    "decode_context": 0.0,
    "samples": 0.0,
}


@pytest.fixture(scope="session")
def sim_model(tmp_path_factory):
    """A model folder whose config the simulated engine reads (it never runs the weights)."""
    return build_checkpoint(tmp_path_factory.mktemp("sim") / "llama", "llama", max_position_embeddings=4096)


@pytest.fixture(scope="session")
def profile(sim_model) -> EngineProfile:
    return fit_free_profile(str(sim_model), COEFFICIENTS)


def fit_free_profile(model: str, coefficients: dict[str, float]) -> EngineProfile:
    """A profile with these coefficients, as if fitted: 2048 blocks of 16, 32 sequences, 1024 tokens a step."""
    settings = EngineSettings(
        model=model,
        startup="test",
        block_size=16,
        num_blocks=2048,
        max_num_seqs=32,
        max_num_batched_tokens=1024,
        max_model_len=4096,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
    )
    return EngineProfile(
        machine="test",
        settings=settings,
        coefficients=dict(coefficients),
        fit=FitQuality(steps=0, median_relative_error=0, p90_relative_error=0),
    )


def service(**autoscaling) -> InferenceServiceSpec:
    spec = {"model": {"name": "m", "path": "m", "hostPath": "/m"}, "replicas": 1}
    if autoscaling:
        spec["autoscaling"] = {"prometheusAddress": "http://prometheus:9090", **autoscaling}
    return InferenceServiceSpec.model_validate(spec)
