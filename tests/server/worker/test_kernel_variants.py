"""No Triton kernel compiles after start-up. On a GPU a kernel compiles at the first launch of
each variant (its constants, and what Triton specialises its other arguments on), for seconds in
which no request advances. Here, in the interpreter, each launch's key is Triton's own, computed
for sm_90 (kernels/triton_variants.py): every key the eager and graph paths produce over every
dimension a step varies in must be one the start-up warm-up already launched. The engine here
serves LoRA adapters too, so that their kernels run."""

from __future__ import annotations

import itertools
import logging
import random

import pytest
import torch

from argosy import SamplingParams
from argosy.kernels import triton_elementwise, triton_variants
from argosy.kernels.triton_backend import TritonAttention
from argosy.server.worker.block_tables import BlockTables
from argosy.server.worker.step_inputs import SequenceChunk
from tests.checkpoints import tiny_llm

BLOCK = 16
MAX_LEN = 512


class H200Attention(TritonAttention):
    """The Triton backend as on an H200 (132 SMs): decode contexts are split across programs,
    which on CPU the backend never does, so that the splits' reduction runs."""

    def __init__(self, device: torch.device, num_kv_heads: int):
        super().__init__(device, num_kv_heads)
        self.target_programs = 2 * 132


@pytest.fixture
def engine(llama_checkpoint, monkeypatch):
    # A fresh process holds no compiled kernel: forget what earlier tests launched.
    for keys in triton_variants._RECORDED.values():
        keys.clear()
    monkeypatch.setattr("argosy.kernels.triton_backend.TritonAttention", H200Attention)
    return llm_on_triton(llama_checkpoint).engine.core.executor.worker


def llm_on_triton(llama_checkpoint):
    return tiny_llm(
        llama_checkpoint,
        attention_backend="triton",
        cuda_graph_sizes=[1, 2, 4],
        max_num_seqs=8,
        max_model_len=MAX_LEN,
        block_size=BLOCK,
        enable_lora=True,
        max_loras=2,
    )


def steps(num_blocks: int, rng: random.Random):
    """(chunks' (start, token count), block copies) of each step: decode batches through the
    graphs (a captured size, one padded up to the next, the largest) and eager beyond them;
    contexts from one token to max_model_len (tables of one block, two, the longest; one split
    and two); prefill chunks from the start and mid-sequence, alone and beside decodes; and
    copy-on-write."""
    contexts = [1, BLOCK, BLOCK + 1, 256, 257, MAX_LEN, MAX_LEN]
    # What a step's keys could depend on varies independently: each batch size and each context
    # once, rather than their product (the interpreter takes a second a step).
    for batch, context in zip(itertools.cycle([1, 3, 4, 7]), contexts):
        yield [(context - 1, 1)] * batch, []
    for q_len, start in itertools.product([2, 33], [0, 300]):
        yield [(start, q_len), (rng.choice(contexts) - 1, 1)], []
    yield [(5, 17)], []
    yield [(7, 1), (40, 1)], [(rng.randrange(num_blocks), rng.randrange(num_blocks)) for _ in range(3)]


def test_every_variant_a_step_can_launch_was_launched_during_start_up(engine):
    warmed = engine.variants.by_kernel()
    assert all(warmed.values()), warmed  # each kernel, copies and the splits' reduction included
    assert engine.report.kernel_variants == sum(warmed.values()) and "kernel variants warmed" in engine.report.line()
    runner, rng = engine.runner, random.Random(0)
    num_blocks = runner.kv_cache.shape[2] - 1  # the null block is the graphs' own
    for step, (shape, copies) in enumerate(steps(num_blocks, rng)):
        tables = BlockTables(-(-MAX_LEN // BLOCK), runner.device)
        chunks = []
        for start, q_len in shape:
            row, table = tables.add(), [rng.randrange(num_blocks) for _ in range(-(-(start + q_len) // BLOCK))]
            tables.change(row, 0, table)
            lora_slot = rng.choice([-1, 0, 1])
            chunks.append(SequenceChunk([rng.randrange(300)] * q_len, start, table, True, row, lora_slot))
        tables.flush()
        runner.execute(chunks, copies, tables)
        assert engine.variants.by_kernel() == warmed, f"step {step}: {shape}, copies {copies}"


def test_a_key_follows_what_triton_specialises_and_nothing_else():
    """The key function itself: an integer Triton specialises is keyed by being 1, divisible by
    16 or neither; one it is told not to specialise, and a float, only by their type."""
    from argosy.kernels.triton_attention_decode import _decode_reduce_kernel

    aligned = torch.zeros(4)

    def key(stride, num_splits, out=aligned):
        args = (out, out, out, torch.zeros(1, dtype=torch.long), stride, num_splits)
        return triton_variants.variant_key(_decode_reduce_kernel, args, dict(HEAD_DIM=8, D_PAD=16, SPLITS_PAD=64))

    assert len({key(1, 2), key(16, 2), key(17, 2)}) == 3 and key(32, 2) == key(16, 2)
    assert key(17, 1) == key(17, 2) == key(17, 64)  # num_splits is not specialised
    assert key(17, 2, out=torch.zeros(5)[1:]) != key(17, 2)  # a misaligned pointer is another variant


def test_a_variant_compiled_while_serving_is_logged_once(llama_checkpoint, caplog):
    llm = llm_on_triton(llama_checkpoint)
    executor = llm.engine.core.executor.worker
    silu_variants = executor.variants.by_kernel()["_silu_and_mul_kernel"]
    # A width no model layer has: a new variant.
    triton_elementwise.silu_and_mul(torch.zeros(1, 6, device=executor.runner.device))
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    with caplog.at_level(logging.WARNING, logger="argosy.engine"):
        llm.generate([{"prompt_token_ids": [5, 6, 7]}], params)
        llm.generate([{"prompt_token_ids": [5, 6, 7]}], params)  # nothing new: nothing more to say
    warnings = [r.getMessage() for r in caplog.records if "compiled a variant" in r.getMessage()]
    assert len(warnings) == 1 and f"{{'_silu_and_mul_kernel': {silu_variants + 1}}}" in warnings[0]
