"""Decode steps through the CUDA-graph runner's CPU twin: the same static buffers, padding to
the next captured size and bucketing, with an eager call where a GPU would replay. Greedy
outputs must not change, for batches that land between the captured sizes, nor for a
speculative step's verifications, which take graphs of their own width."""

from __future__ import annotations

import pytest

from argosy import SamplingParams
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import InvalidRequestError
from argosy.server.spec_decode.config import SpeculativeConfig
from argosy.server.worker.cuda_graphs import capture_shapes, capture_sizes
from tests.checkpoints import tiny_llm
from tests.server.spec_decode.test_speculative_engine import propose_from


def test_default_sizes_follow_vllm_and_reach_max_num_seqs():
    assert capture_sizes([], 256) == [1, 2, 4, *range(8, 257, 8)]
    assert capture_sizes([], 20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes([], 3) == [1, 2, 3]
    assert capture_sizes([16, 3, 1, 64, 3], 32) == [1, 3, 16]


def greedy(llm, prompts, max_tokens):
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


# The triton backend (interpreted here) keeps the metadata captured over the static buffers, as
# a CUDA graph does; the torch backend plans its tiles at each replay.
@pytest.mark.parametrize("arch, backend", [("llama", "torch"), ("qwen3", "torch"), ("llama", "triton")])
def test_graph_twin_gives_the_eager_greedy_tokens(checkpoints, arch, backend):
    # 7 prompts of different lengths finish at different steps, so decode batches of 7, 6, ... 1
    # run: most between captured sizes (padded up to 2, 4 or 8), buffers reused as rows leave.
    prompts = [[(17 * i + j) % 300 + 3 for j in range(3 + 5 * i)] for i in range(7)]
    max_tokens = [4 + 3 * i for i in range(7)]
    # A short profiling pass; the torch backend's twin is a CPU mechanism (on CUDA that backend is
    # never captured), the triton backend runs real graphs where there is a GPU.
    settings = dict(
        attention_backend=backend, max_num_batched_tokens=64, device="cpu" if backend == "torch" else "auto"
    )
    eager = tiny_llm(checkpoints[arch], enforce_eager=True, **settings)
    assert eager.engine.core.executor.worker.runner.graphs is None
    twin = tiny_llm(checkpoints[arch], cuda_graph_sizes=[1, 2, 4, 8], max_num_seqs=8, **settings)
    graphs = twin.engine.core.executor.worker.runner.graphs
    assert graphs.sizes == [1, 2, 4, 8] and twin.engine.core.executor.worker.report.graph_sizes == [1, 2, 4, 8]
    batches: list[int] = []
    run = graphs.run
    graphs.run = lambda chunks, tables: (batches.append(len(chunks)), run(chunks, tables))[1]
    for n in (3, 7):  # separate generate calls: the second reuses the buffers the first dirtied
        assert greedy(twin, prompts[:n], max_tokens[:n]) == greedy(eager, prompts[:n], max_tokens[:n])
    assert {3, 5, 6, 7} <= set(batches)  # batches padded to 4 and 8 ran through the runner


@pytest.mark.parametrize("sizes", [[0, 4], [512]])
def test_graph_sizes_must_be_positive_and_one_at_most_max_num_seqs(sizes):
    with pytest.raises(InvalidRequestError, match="cuda_graph_sizes") as error:
        EngineConfig(cuda_graph_sizes=sizes, max_num_seqs=256)
    assert error.value.param == "cuda_graph_sizes"


def test_enforce_eager_and_the_cpu_default_run_without_graphs(checkpoints):
    cpu = tiny_llm(checkpoints["llama"], device="cpu")
    assert cpu.engine.core.executor.worker.runner.graphs is None  # on CPU only given sizes turn the twin on
    llm = tiny_llm(checkpoints["llama"], cuda_graph_sizes=[1, 2], enforce_eager=True)
    assert (
        llm.engine.core.executor.worker.runner.graphs is None
        and llm.engine.core.executor.worker.report.graph_sizes == []
    )
    assert (
        llm.engine.core.executor.worker.runner.kv_cache.shape[2] == llm.stats().kv_blocks_total
    )  # no null block without graphs


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_verification_steps_run_through_graphs_of_their_width_and_keep_the_greedy_tokens(checkpoints, backend):
    # Drafts from the eager run's own tokens, every fourth wrong (as the speculation tests do):
    # uniform steps of 3 sequences verifying 3 drafts each take the graphs of width 4, padded to 4.
    prompts = [[(11 * i + j) % 300 + 3 for j in range(4 + 6 * i)] for i in range(3)]
    max_tokens = [12, 15, 18]
    settings = dict(
        attention_backend=backend, max_num_batched_tokens=64, device="cpu" if backend == "torch" else "auto"
    )
    expected = greedy(tiny_llm(checkpoints["llama"], enforce_eager=True, **settings), prompts, max_tokens)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 6}
    twin = tiny_llm(checkpoints["llama"], cuda_graph_sizes=[1, 2, 4, 8], max_num_seqs=8, speculative_config=spec,
                    **settings)  # fmt: skip
    graphs = twin.engine.core.executor.worker.runner.graphs
    assert graphs.sizes_of == {1: [1, 2, 4, 8], 4: [1, 2, 4, 8]}  # 8: the first size past the limit of 6
    requests = [
        (p, SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)) for p, m in zip(prompts, max_tokens)
    ]
    propose_from(twin, requests, expected)
    shapes: list[tuple[int, int]] = []
    run = graphs.run
    graphs.run = lambda chunks, tables: (shapes.append((len(chunks), len(chunks[0].token_ids))), run(chunks, tables))[1]
    assert greedy(twin, prompts, max_tokens) == expected
    assert (3, 4) in shapes  # padded to 4
    assert twin.stats().spec_decode.num_accepted_tokens > 0


def test_shapes_with_speculation_stop_at_the_first_size_past_its_batch_limit():
    spec = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 16})
    assert capture_shapes([1, 2, 4, 8], None) == [(1, 1), (2, 1), (4, 1), (8, 1)]
    assert capture_shapes([1, 2, 4, 8, 16, 24, 32], spec)[7:] == [(1, 5), (2, 5), (4, 5), (8, 5), (16, 5)]
    assert capture_shapes([1, 2, 4, 8], spec)[4:] == [(1, 5), (2, 5), (4, 5), (8, 5)]  # all, when none reaches it
