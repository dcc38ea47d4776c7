"""The server against what a hostile or careless client sends to the surfaces added since the first
hardening round, each way found to hurt it: integers past what the engine's wire carries, a flood
of tools, a 1 MB `user`, another client's heavy grammars, a FIFO or NaN weights in a checkpoint,
NaN or oversized adapters, an ignored logit_bias, and the smaller leaks (a `param` left out, the
model's path shown). After each, nothing stays in flight and a sleep and wake-up complete."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest
from safetensors.torch import load_file, save_file

from argosy import LLM, SamplingParams
from tests.adapters import make_adapter
from tests.checkpoints import build_checkpoint
from tests.processes import MODEL, children
from tests.server.api.servers import EVERY_SURFACE_ON, run_server
from tests.server.structured.schema_corpus import SLOW_SCHEMA

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
HUGE = 10**30  # a JSON integer, written out in full: no 64-bit field holds it


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    with run_server(llama_checkpoint, **EVERY_SURFACE_ON, structured_outputs_compile_timeout=60) as running:
        yield running


def assert_left_nothing(server) -> None:
    """Nothing in flight or counted waiting, and a weight change (sleep, then wake-up) completes."""
    assert server.engine.num_in_flight == 0
    assert server.metric("argosy_num_requests_waiting") == 0
    assert server.metric("argosy_num_requests_running") == 0
    assert httpx.post(f"{server.url}/sleep?level=1", timeout=30).status_code == 200
    assert httpx.post(f"{server.url}/wake_up", timeout=30).status_code == 200
    assert httpx.post(f"{server.url}/v1/completions", json=COMPLETION, timeout=30).status_code == 200


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/chat/completions", {**CHAT, "max_tokens": None, "min_tokens": HUGE}, "min_tokens"),
        ("/v1/completions", {**COMPLETION, "priority": HUGE}, "priority"),
        ("/v1/completions", {**COMPLETION, "priority": -HUGE}, "priority"),
        ("/v1/completions", {**COMPLETION, "seed": HUGE}, "seed"),
        ("/v1/completions", {**COMPLETION, "n": HUGE}, "n"),
        ("/v1/completions", {**COMPLETION, "max_tokens": HUGE}, "max_tokens"),
        ("/v1/completions", {**COMPLETION, "stop_token_ids": [HUGE]}, "stop_token_ids"),
        ("/v1/completions", {**COMPLETION, "prompt": [5, HUGE]}, "prompt"),
        ("/v1/completions", {**COMPLETION, "logprobs": HUGE}, "logprobs"),
        ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": HUGE}, "top_logprobs"),
        ("/v1/completions", {**COMPLETION, "top_k": HUGE}, "top_k"),
        ("/v1/completions", {**COMPLETION, "logit_bias": {"5": HUGE}}, "logit_bias"),
        ("/v1/completions", {**COMPLETION, "logit_bias": {str(HUGE): 1}}, "logit_bias"),
        ("/v1/completions", {**COMPLETION, "user": "u" * (1 << 20)}, "user"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 else "",
)
def test_values_past_what_the_engine_carries_are_400s_that_leave_nothing_behind(server, path, body, param):
    answer = httpx.post(f"{server.url}{path}", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.text
    assert_left_nothing(server)


def test_sixty_thousand_tools_neither_block_the_loop_nor_take_long(server):
    tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(60_000)]  # 2.9 MB
    tools.append(tools[-1])  # the last one twice: every name is checked before the 400
    answer: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: answer.append(
            httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "tools": tools}, timeout=120)
        )
    )
    sender.start()
    slowest = 0.0
    while sender.is_alive():
        started = time.monotonic()
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.05)
    sender.join()
    assert answer[0].status_code == 400 and "twice" in answer[0].json()["error"]["message"]
    assert slowest < 5, f"/health took {slowest:.1f} s while the tools were read"  # 38 s when the loop blocked
    assert_left_nothing(server)


def core_cpu_seconds(server) -> float:
    """CPU time the engine core's process and its live children have used so far."""
    core = server.engine.core.pid
    total = 0
    for pid in [core, *children(core)]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def test_another_clients_heavy_grammars_starve_no_one_and_stop_when_their_clients_go(server):
    def heavy(i: int) -> None:
        schema = {**SLOW_SCHEMA, "title": f"heavy {i}"}
        body = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "h", "schema": schema}}}
        with contextlib.suppress(httpx.TimeoutException):  # the client gives up and goes: so must its compile
            httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=6)

    attackers = [threading.Thread(target=heavy, args=(i,)) for i in range(4)]
    for thread in attackers:
        thread.start()
    time.sleep(1)  # their compiles under way
    # Another client (another address): its trivial grammar compiles beside them, not after.
    other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    body = {**CHAT, "max_tokens": 4, "structured_outputs": {"regex": "[ab]{4}"}}
    answer = other.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert all(t.is_alive() for t in attackers), "the trivial grammar waited for the heavy ones"
    for thread in attackers:
        thread.join()
    time.sleep(1)  # the disconnects seen, the compiles stopped
    before = core_cpu_seconds(server)
    time.sleep(2)
    assert core_cpu_seconds(server) - before < 0.5, "compiles burn on after their clients left"
    assert_left_nothing(server)


@pytest.fixture(scope="module")
def checkpoint_copy(llama_checkpoint, tmp_path_factory):
    def copy(name: str) -> Path:
        return Path(shutil.copytree(llama_checkpoint, tmp_path_factory.mktemp(name) / "llama"))

    return copy


def update(server, path) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/update_weights_from_disk", json={"model_path": str(path)}, timeout=60)


def greedy(server) -> str:
    body = {**COMPLETION, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).json()["choices"][0]["text"]


def test_a_fifo_in_place_of_the_weights_is_a_400_at_once(server, checkpoint_copy):
    folder = checkpoint_copy("fifo")
    (shard,) = folder.glob("*.safetensors")
    shard.unlink()
    os.mkfifo(shard)  # opening it for reading would wait for a writer for ever
    started = time.monotonic()
    answer = update(server, folder)
    assert answer.status_code == 400 and "not a regular file" in answer.json()["error"]["message"], answer.text
    assert answer.json()["error"]["param"] == "model_path" and time.monotonic() - started < 20
    assert_left_nothing(server)


def test_nan_weights_are_a_400_naming_the_tensor_and_the_old_weights_serve_on(server, checkpoint_copy):
    before = greedy(server)
    folder = checkpoint_copy("nan")
    (shard,) = folder.glob("*.safetensors")
    tensors = load_file(shard)
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name][3, 5] = float("nan")
    save_file(tensors, shard, metadata={"format": "pt"})
    answer = update(server, folder)
    assert answer.status_code == 400, answer.text
    assert name in answer.json()["error"]["message"] and answer.json()["error"]["param"] == "model_path"
    assert greedy(server) == before
    assert_left_nothing(server)


def test_a_mismatched_checkpoint_names_model_path(server, tmp_path):
    other = build_checkpoint(tmp_path / "wide", "llama", hidden_size=32, head_dim=8)
    answer = update(server, other)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "model_path", answer.text


def load_adapter(server, name: str, path: Path) -> httpx.Response:
    body = {"lora_name": name, "lora_path": str(path)}
    return httpx.post(f"{server.url}/v1/load_lora_adapter", json=body, timeout=60)


def test_nan_adapters_and_alphas_are_400s_naming_what_is_wrong(server, llama_checkpoint, tmp_path):
    folder = make_adapter(llama_checkpoint, tmp_path / "nan", ["q_proj", "v_proj"])
    weights = folder / "adapter_model.safetensors"
    tensors = load_file(weights)
    name = next(k for k in tensors if "lora_B" in k)
    tensors[name][0, 0] = float("inf")
    save_file(tensors, weights)
    answer = load_adapter(server, "nan", folder)
    assert answer.status_code == 400 and name in answer.json()["error"]["message"], answer.text
    alpha = make_adapter(llama_checkpoint, tmp_path / "alpha", ["q_proj"])
    config = json.loads((alpha / "adapter_config.json").read_text())
    (alpha / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": float("nan")}))
    answer = load_adapter(server, "alpha", alpha)
    assert answer.status_code == 400 and "lora_alpha" in answer.json()["error"]["message"], answer.text
    assert {m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]} == {MODEL}
    assert_left_nothing(server)


def bytes_read() -> int:
    """What this process (the server's API side runs in it) has read through system calls."""
    return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])


def test_an_oversized_adapter_file_is_refused_from_its_header_before_it_is_read(server, llama_checkpoint, tmp_path):
    folder = make_adapter(llama_checkpoint, tmp_path / "sparse", ["q_proj"])
    with open(folder / "adapter_model.safetensors", "r+b") as f:
        f.truncate(1 << 30)  # a sparse GiB after the tensors the header describes
    before = bytes_read()
    answer = load_adapter(server, "sparse", folder)
    assert answer.status_code == 400 and "header describes" in answer.json()["error"]["message"], answer.text
    assert bytes_read() - before < 64 << 20  # the header, not the GiB


def test_logit_bias_moves_the_greedy_choice_as_the_models_own_logprobs_rank_it(server, llama_checkpoint):
    offline = LLM(str(llama_checkpoint), dtype="float32", kv_cache_memory=4 << 20)
    ranked = offline.generate("hi", SamplingParams(temperature=0, max_tokens=1, logprobs=2))[0].outputs[0]
    first, second = sorted(ranked.logprobs[0], key=lambda t: ranked.logprobs[0][t].rank)[:2]
    tokenizer = offline.get_tokenizer()
    client = server.client()
    plain = client.completions.create(model=MODEL, prompt="hi", max_tokens=1, temperature=0)
    assert plain.choices[0].text == tokenizer.decode([first])
    banned = client.completions.create(
        model=MODEL, prompt="hi", max_tokens=1, temperature=0, logit_bias={str(first): -100}
    )
    assert banned.choices[0].text == tokenizer.decode([second])  # the runner-up takes its place
    (a,) = tokenizer.encode("a", False)
    forced = client.completions.create(model=MODEL, prompt="hi", max_tokens=4, temperature=0, logit_bias={str(a): 100})
    assert forced.choices[0].text == "aaaa"
    for bias, words in (({"7": 101}, "[-100, 100]"), ({"x": 1}, "token ids"), ({"100000": 1}, "vocabulary")):
        answer = httpx.post(f"{server.url}/v1/completions", json={**COMPLETION, "logit_bias": bias})
        assert answer.status_code == 400 and words in answer.json()["error"]["message"], answer.text
        assert answer.json()["error"]["param"] == "logit_bias"


def test_models_never_shows_the_servers_paths(server, llama_checkpoint):
    listed = httpx.get(f"{server.url}/v1/models").text
    assert str(llama_checkpoint) not in listed and json.loads(listed)["data"][0]["root"] == MODEL
