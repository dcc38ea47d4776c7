"""The executors: every call and result crosses as a message (through the wire codec, the engine's
outputs unchanged); the multi-process executor gives the in-process one's outputs, adapters,
constraints, sleep and weight updates included; a worker's error crosses as its own kind; a rank
killed while starting ends the start-up at once naming the rank; a script that would start the
engine again in every rank is told why; shutdown ends every rank by its message."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

import pytest

from argosy import LLM, LoRARequest, SamplingParams, StructuredOutputsParams
from argosy.server.exceptions import CheckpointError, CheckpointNotFoundError, InvalidRequestError
from argosy.server.executor.multiproc import RankDiedError
from argosy.server.executor.worker_calls import decode_call, encode, read_reply, run_call
from argosy.server.lora.request import AdapterRef
from tests.adapters import make_adapter
from tests.checkpoints import build_checkpoint, tiny_llm

PROMPTS = [[5, 6, 7, 8], list(range(20, 50)), [9] * 12]


def workload(llm: LLM, adapter: LoRARequest, update: str) -> list:
    """Greedy, seeded sampling with logprobs and n > 1, a constraint, an adapter; then after a
    weight update, and after sleep and wake-up."""
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(n=2, temperature=0.9, seed=4, max_tokens=10, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=["yes", "no"])),
    ]
    out = []

    def run(lora=None):
        for request in llm.generate(prompts, params, lora_request=lora):
            out.append([(c.token_ids, c.text, c.logprobs and [list(lp) for lp in c.logprobs]) for c in request.outputs])

    run()
    run(adapter)
    llm.update_weights(update)
    run()
    llm.sleep(1)
    llm.wake_up()
    run(adapter)
    return out


@pytest.fixture
def parts(llama_checkpoint, tmp_path):
    adapter = LoRARequest("a", 1, str(make_adapter(llama_checkpoint, tmp_path / "a", seed=2)))
    return adapter, str(build_checkpoint(tmp_path / "update", "llama", seed=5))


def test_every_call_and_result_crosses_as_a_message_and_the_outputs_stay(llama_checkpoint, parts):
    direct = workload(tiny_llm(llama_checkpoint, enable_lora=True), *parts)
    llm = tiny_llm(llama_checkpoint, enable_lora=True)
    executor = llm.engine.core.executor
    calls = Counter()

    def through_bytes(call):
        calls[type(call).__name__] += 1
        return read_reply(call, run_call(executor.worker, decode_call(encode(call))))

    executor.call = through_bytes
    assert workload(llm, *parts) == direct
    assert {"Execute", "AddAdapter", "UpdateWeights", "Sleep", "WakeUp"} <= set(calls)


def test_the_multiprocess_executor_gives_the_in_process_ones_outputs(llama_checkpoint, parts):
    uni = workload(tiny_llm(llama_checkpoint, enable_lora=True), *parts)
    llm = tiny_llm(llama_checkpoint, enable_lora=True, distributed_executor_backend="mp")
    assert type(llm.engine.core.executor).__name__ == "MultiprocExecutor"
    assert workload(llm, *parts) == uni


def test_a_workers_error_crosses_as_its_own_kind(llama_checkpoint, parts, tmp_path, capfd):
    adapter, _ = parts
    llm = tiny_llm(llama_checkpoint, enable_lora=True, distributed_executor_backend="mp")
    executor = llm.engine.core.executor
    changed = AdapterRef("a", adapter.lora_path, "00" * 32)  # the name stood for other weights
    with pytest.raises(InvalidRequestError, match="the weights changed since adapter 'a' was loaded") as caught:
        executor.add_adapter(changed)
    assert caught.value.param == "lora_path"
    other = build_checkpoint(tmp_path / "other", "qwen2")
    with pytest.raises(CheckpointError, match="does not match the running model"):
        llm.update_weights(str(other))
    out = llm.generate({"prompt_token_ids": [5, 6]}, SamplingParams(temperature=0.0, max_tokens=3))
    assert len(out[0].outputs[0].token_ids) == 3  # the worker serves on
    with pytest.raises(CheckpointNotFoundError) as missing:
        tiny_llm(tmp_path / "nowhere", distributed_executor_backend="mp")
    assert missing.value.exit_code == 66
    broken = tmp_path / "broken"
    shutil.copytree(llama_checkpoint, broken)
    [weights] = broken.glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # read by the rank as it starts
    capfd.readouterr()
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        tiny_llm(broken, distributed_executor_backend="mp")
    logged = capfd.readouterr().err  # the rank's own traceback, from its process
    assert "Start failed on this rank" in logged and "Traceback" in logged


def test_a_rank_killed_while_starting_ends_the_start_up_at_once_naming_it(llama_checkpoint):
    import multiprocessing

    failure: list[BaseException] = []
    before = {p.pid for p in multiprocessing.active_children()}

    def start() -> None:
        try:
            tiny_llm(llama_checkpoint, tensor_parallel_size=2)
        except BaseException as exc:
            failure.append(exc)

    starting = threading.Thread(target=start)
    starting.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ranks = [p for p in multiprocessing.active_children() if p.name == "argosy-rank-1"]
        if ranks and ranks[0].pid:
            ranks[0].kill()
            break
        time.sleep(0.01)
    killed = time.monotonic()
    starting.join(60)
    assert not starting.is_alive() and time.monotonic() - killed < 15
    assert isinstance(failure[0], RankDiedError) and "rank 1 exited" in str(failure[0])
    assert not [p for p in multiprocessing.active_children() if p.pid not in before]  # no rank left


def test_a_script_without_the_main_guard_is_told_why_its_ranks_ended(llama_checkpoint, tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(f"""
            from argosy import LLM
            llm = LLM({str(llama_checkpoint)!r}, tensor_parallel_size=2, dtype="float32", kv_cache_memory=4 << 20)
            print("started")
        """)
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-P", str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "started" not in done.stdout
    assert 'must sit under `if __name__ == "__main__":`' in done.stderr
    assert time.monotonic() - started < 60


def test_shutdown_stops_every_rank_in_order(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint, tensor_parallel_size=2)
    executor = llm.engine.core.executor
    executor.shutdown()  # as the engine core does when it stops
    assert [proc.exitcode for proc in executor.procs] == [0, 0]  # ended by the message, not killed
