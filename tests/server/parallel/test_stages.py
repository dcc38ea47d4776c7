"""Pipeline stages: the decoder layers split into contiguous stages, the first embedding the
tokens and the last holding the LM head, and the stage counts that split them badly refused."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.model_config import ModelConfig
from argosy.server.parallel.stages import check_pipeline_parallel, split_layers
from tests.checkpoints import build_checkpoint


@given(layers=st.integers(1, 200), size=st.integers(1, 64))
def test_stages_cover_every_layer_once_in_order_as_evenly_as_they_divide(layers, size):
    stages = split_layers(layers, size)
    assert [s.index for s in stages] == list(range(size)) and all(s.size == size for s in stages)
    assert stages[0].start == 0 and stages[-1].end == layers
    assert all(a.end == b.start for a, b in itertools.pairwise(stages))
    counts = [s.num_layers for s in stages]
    assert max(counts) - min(counts) <= 1
    assert counts == sorted(counts, reverse=True)  # the extra layers on the first stages, never the last
    assert [s.first for s in stages] == [i == 0 for i in range(size)]
    assert [s.last for s in stages] == [i == size - 1 for i in range(size)]


def test_the_default_models_thirty_layers_in_four_stages():
    stages = split_layers(30, 4)
    assert [(s.start, s.end) for s in stages] == [(0, 8), (8, 16), (16, 23), (23, 30)]
    assert stages[0].describe() == "stage 0: embedding, layers 0-7"
    assert stages[3].describe() == "stage 3: layers 23-29, norm and LM head"
    assert split_layers(30, 1)[0].describe() == "stage 0: embedding, layers 0-29, norm and LM head"


def test_stage_counts_that_split_the_layers_badly_are_refused_with_the_numbers(tmp_path):
    cfg = ModelConfig.from_folder(build_checkpoint(tmp_path / "llama", "llama"))
    thirty = dataclasses.replace(cfg, num_layers=30)
    for size in (1, 2, 3, 4, 8, 12):  # 12: stages of 3 and 2
        check_pipeline_parallel(thirty, size)
    with pytest.raises(InvalidRequestError, match="exceeds the model's 30 decoder layers") as refused:
        check_pipeline_parallel(thirty, 31)
    assert refused.value.param == "pipeline_parallel_size"
    with pytest.raises(InvalidRequestError, match=r"stages of 2 and 1.*evenly: \[2, 3, 5, 6, 10, 15\]"):
        check_pipeline_parallel(thirty, 16)
