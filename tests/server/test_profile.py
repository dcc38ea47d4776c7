"""`argosy profile`: the engine's steps timed on this machine and fitted, and the fit itself."""

from __future__ import annotations

import random

import pytest

from argosy.cli import main
from argosy.server.executor.plan import SampleRow, ScheduledChunk, StepPlan
from argosy.server.profile.engine_profile import EngineProfile, fit_coefficients
from argosy.server.profile.step_shape import FEATURES, StepShape


def test_a_plans_shape_counts_prompts_decodes_and_samples():
    plan = StepPlan(
        new_sequences=[],
        finished=[],
        chunks=[
            ScheduledChunk(0, list(range(100)), 0, True),  # a whole prompt
            ScheduledChunk(1, list(range(50)), 200, False),  # a later chunk of a long prompt
            ScheduledChunk(2, [7], 30, True),  # decodes
            ScheduledChunk(3, [7], 90, True),
            ScheduledChunk(4, [7], 0, True),  # a one-token prompt is a prompt
        ],
        block_copies=[],
        samples=[SampleRow(0, 0), SampleRow(2, 1), SampleRow(3, 2), SampleRow(4, 3)],
    )
    shape = StepShape.of(plan)
    assert (shape.prefill_tokens, shape.decode_seqs, shape.decode_context, shape.samples) == (151, 2, 31 + 91, 4)
    assert shape.prefill_attention == pytest.approx((100 * 50.5 + 50 * 225.5 + 1) / 1000)


def test_the_fit_recovers_the_coefficients_that_made_the_steps():
    truth = {
        "steps": 0.004,
        "prefill_tokens": 2e-4,
        "prefill_attention": 1e-5,
        "decode_seqs": 3e-4,
        "decode_context": 2e-7,
        "samples": 0.0,
    }
    rng = random.Random(0)
    samples = []
    for _ in range(300):
        shape = StepShape(
            1, rng.choice([0, rng.randrange(1, 2048)]), rng.random() * 500, rng.randrange(64), rng.randrange(50000), 0
        )
        seconds = sum(truth[name] * value for name, value in zip(FEATURES, shape.features()))
        samples.append((shape, seconds * (1 + rng.uniform(-0.01, 0.01))))
    coefficients, quality = fit_coefficients(samples)
    for name in ("steps", "prefill_tokens", "decode_seqs", "decode_context"):
        assert coefficients[name] == pytest.approx(truth[name], rel=0.05), name
    assert all(value >= 0 for value in coefficients.values())
    assert quality.median_relative_error < 0.01 and quality.steps == 300


def test_the_profile_command_times_the_engine_and_writes_the_profile(llama_checkpoint, tmp_path, capsys):
    output = tmp_path / "profile.json"
    assert (
        main(["profile", "--model", str(llama_checkpoint), "--quick", "--output", str(output), "--max-num-seqs", "8"])
        == 0
    )
    profile = EngineProfile.load(output)
    assert profile.settings.model == str(llama_checkpoint) and profile.settings.max_num_seqs == 8
    assert profile.settings.num_blocks > 0 and profile.fit.steps == len(profile.samples) > 10
    assert all(value >= 0 for value in profile.coefficients.values()) and profile.coefficients["steps"] > 0
    decode = StepShape(1, 0, 0, 4, 200, 4)
    assert 0 < profile.step_seconds(decode) < 1
    assert "relative error of the fit" in capsys.readouterr().out
