"""The step plan is the whole of what crosses to the device side: plain data that survives
MessagePack unchanged in what it makes the engine produce, and from which the device keeps an
exact copy of every block table (through growth, copy-on-write, preemption, prefix hits and
forks) and of which sequences exist."""

from __future__ import annotations

import random

import msgspec

from argosy import SamplingParams
from argosy.server.executor.plan import StepPlan
from tests.checkpoints import tiny_llm

BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4  # one block of the tiny llama, float32


def mixed(count: int, seed: int) -> list[tuple[list[int], SamplingParams]]:
    """Shared prefixes (prefix hits), n > 1 (forks and copy-on-write), seeded sampling and greedy."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 300) for _ in range(40)]
    requests = []
    for i in range(count):
        prompt = (prefix if i % 3 == 0 else []) + [rng.randrange(3, 300) for _ in range(rng.randrange(5, 60))]
        params = SamplingParams(
            n=1 + i % 3, temperature=0.0 if i % 2 else 1.0, seed=i, max_tokens=rng.randrange(8, 40), ignore_eos=True
        )
        requests.append((prompt, params))
    return requests


def generate(llm, requests) -> list[list[list[int]]]:
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in requests], [params for _, params in requests])
    return [[c.token_ids for c in o.outputs] for o in outs]


def test_plans_through_msgpack_give_the_same_outputs(llama_checkpoint):
    requests = mixed(12, seed=3)
    direct = generate(tiny_llm(llama_checkpoint), requests)
    llm = tiny_llm(llama_checkpoint)
    executor = llm.engine.core.executor
    execute, encoder, decoder = executor.execute, msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(StepPlan)
    plans = 0

    def through_bytes(plan: StepPlan):
        nonlocal plans
        plans += 1
        return execute(decoder.decode(encoder.encode(plan)))

    executor.execute = through_bytes
    assert generate(llm, requests) == direct and plans > 0


def test_the_device_side_holds_the_engines_block_tables_and_sequences_at_every_step(llama_checkpoint):
    # 24 blocks for 16 requests of up to ~140 tokens, n up to 3: preemptions and re-admissions.
    llm = tiny_llm(llama_checkpoint, kv_cache_memory=24 * BLOCK_BYTES, max_model_len=256, max_num_batched_tokens=64)
    core = llm.engine.core
    executor, execute = core.executor, core.executor.execute
    seen: set[int] = set()

    def checked_execute(plan: StepPlan):
        result = execute(plan)
        seqs = {seq.seq_id: seq for request in core.requests.values() for seq in request.seqs}
        states = executor.worker.states
        for chunk in plan.chunks:  # the step ran on the engine's tables, exactly: on the host and on the device
            table = seqs[chunk.seq_id].block_table
            assert states[chunk.seq_id].block_table == table
            assert states.tables.table[states[chunk.seq_id].table_row, : len(table)].tolist() == table
            seen.add(chunk.seq_id)
        assert len({state.table_row for state in states.values()}) == len(states)  # a row each
        assert states.tables.rows_in_use == len(states)  # and rows of forgotten sequences are free again
        # The device holds exactly the sequences the engine told it of and has not said are gone.
        assert set(executor.worker.states) == core.planner._known
        return result

    executor.execute = checked_execute
    generate(llm, mixed(16, seed=5))
    stats = llm.stats()
    assert seen and stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    first_call = set(seen)
    generate(llm, mixed(2, seed=6))  # the next call's first plan names every finished sequence
    assert executor.worker.states and not set(executor.worker.states) & first_call
