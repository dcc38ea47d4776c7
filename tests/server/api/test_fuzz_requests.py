"""A fuzzing harness over every field of every request model, against a live server on loopback.
Hypothesis takes a valid body and replaces some of its fields, or adds others of the model, with
extreme values: huge and negative integers, NaN and the infinities, deep nesting, long strings,
many items, the wrong type. After each case: no 5xx, nothing left in flight or counted waiting,
and a sleep and wake-up complete; all along, /health answers within a bound. Seeded (the same
cases every run) and bounded in count; the whole harness runs in about a minute."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from argosy.server.api.lora_routes import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from argosy.server.api.protocol import ChatCompletionRequest, CompletionRequest
from argosy.server.api.tokenize_routes import DetokenizeRequest, TokenizeRequest
from argosy.server.api.weight_routes import UpdateWeightsRequest
from argosy.server.responses.request import ResponsesRequest
from tests.adapters import make_adapter
from tests.processes import MODEL
from tests.server.api.servers import EVERY_SURFACE_ON, RunningServer, run_server

EXAMPLES = 40  # per endpoint
HEALTH_BOUND_S = 5.0
FUZZING = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # a failing case as it came: shrinking would resend it many times
    report_multiple_bugs=False,  # the first failure ends it: a wedged server fails every case after
    suppress_health_check=list(HealthCheck),
)
CHAT_MESSAGES = [{"role": "user", "content": "hi"}]

# Each endpoint: its request model, and a body it serves.
ENDPOINTS = {
    "/v1/completions": (CompletionRequest, {"model": MODEL, "prompt": "hi", "max_tokens": 2}),
    "/v1/chat/completions": (ChatCompletionRequest, {"model": MODEL, "messages": CHAT_MESSAGES}),
    "/v1/responses": (ResponsesRequest, {"model": MODEL, "input": "hi", "max_output_tokens": 2}),
    "/tokenize": (TokenizeRequest, {"model": MODEL, "prompt": "hi"}),
    "/detokenize": (DetokenizeRequest, {"model": MODEL, "tokens": [5, 6]}),
    "/v1/update_weights_from_disk": (UpdateWeightsRequest, {"model_path": "/nonexistent"}),
    "/v1/load_lora_adapter": (LoadLoRAAdapterRequest, {"lora_name": "x", "lora_path": "/nonexistent"}),
    "/v1/unload_lora_adapter": (UnloadLoRAAdapterRequest, {"lora_name": "x"}),
}

HUGE_NUMBERS = [10**30, -(10**30), 2**63, -(2**63) - 1, 2**64, 2**31, -(2**31) - 1, -1, 0, 1e308, -0.0]
NON_FINITE = [float("nan"), float("inf"), float("-inf")]
SPECIAL_STRINGS = ["", "\x00", "\ud800", "../../etc/passwd", "/dev/zero", "/proc/self/mem", "%00", "a" * 65536]
# Many items of a list field, each of the shape the field takes (distinct, so that nothing stops
# at a first duplicate).
ITEMS = {
    "tools": lambda i: {"type": "function", "function": {"name": f"f{i}"}},
    "messages": lambda i: {"role": "user", "content": f"m{i}"},
    "input": lambda i: {"role": "user", "content": f"m{i}"},
    "stop": lambda i: f"s{i}",
    "stop_token_ids": lambda i: i % 300,
    "prompt": lambda i: i % 300,
    "tokens": lambda i: i % 300,
    "guided_choice": lambda i: f"c{i}",
}


@dataclass(frozen=True)
class Nested:
    """`depth` levels of lists and objects, one in the next: written into the body's JSON text as it
    is sent (deeper than json.dumps, or hypothesis's printing of a failing case, would go)."""

    depth: int

    def json(self) -> str:
        return '{"k": [' * (self.depth // 2) + "1" + "]}" * (self.depth // 2)


def body_text(body: dict) -> str:
    """The body as JSON, NaN and lone surrogates as Python writes them (escaped)."""
    nests: list[Nested] = []

    def placeholder(value: object) -> str:
        nests.append(value)
        return f"@nested{len(nests) - 1}@"

    text = json.dumps(body, default=placeholder)
    for i, nest in enumerate(nests):
        text = text.replace(f'"@nested{i}@"', nest.json())
    return text


def extremes(hostile_paths: list[str]) -> st.SearchStrategy:
    """Any extreme value, of any type."""
    return st.one_of(
        st.sampled_from(HUGE_NUMBERS + NON_FINITE + SPECIAL_STRINGS + hostile_paths + [True, False, None, [], {}]),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=40),
        st.builds(Nested, st.sampled_from([10, 100, 400, 2000])),
        st.builds(lambda n, v: [v] * n, st.sampled_from([1000, 60000]), st.sampled_from([1, "x", -(10**30), None])),
        st.dictionaries(st.text(max_size=8), st.integers() | st.floats() | st.text(max_size=8), max_size=5),
    )


def typed_extremes(annotation: str, hostile_paths: list[str]) -> st.SearchStrategy:
    """Extreme values of the field's own type, which pass the model's types and reach what lies
    behind them: huge and negative integers, NaN and infinite floats, special strings and paths."""
    kinds = []
    if "int" in annotation:
        kinds.append(st.sampled_from(HUGE_NUMBERS[:-2]) | st.integers())
    if "float" in annotation:
        kinds.append(st.sampled_from(NON_FINITE + HUGE_NUMBERS) | st.floats(allow_nan=True, allow_infinity=True))
    if "str" in annotation:
        kinds.append(st.sampled_from(SPECIAL_STRINGS + hostile_paths) | st.text(max_size=40))
    return st.one_of(*kinds) if kinds else extremes(hostile_paths)


def mutations(model: type, base: dict, hostile_paths: list[str]) -> st.SearchStrategy[dict]:
    """The base body with one to three of the model's fields changed: to an extreme value of the
    field's type (most often), of any type, nothing (None: its default), or, for a list field,
    thousands of well-formed items."""
    fields = sorted(model.model_fields)
    anything = extremes(hostile_paths)
    typed = {name: typed_extremes(str(f.annotation), hostile_paths) for name, f in model.model_fields.items()}

    @st.composite
    def body(draw) -> dict:
        chosen = draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True))
        changed = {}
        for field in chosen:
            kind = draw(st.sampled_from(["typed", "typed", "any", "items" if field in ITEMS else "typed"]))
            if kind == "items":
                changed[field] = [ITEMS[field](i) for i in range(draw(st.sampled_from([1000, 60000])))]
            else:
                changed[field] = draw(typed[field] if kind == "typed" else anything)
        return {**base, **changed}

    return body()


def worst(name: str, annotation: str) -> object:
    """The value of a field's type likeliest to get past its checks and hurt what lies behind."""
    if name in ITEMS:
        return [ITEMS[name](i) for i in range(60000)]
    if "int" in annotation:
        return 10**30
    if "float" in annotation:
        return float("nan")
    if "str" in annotation:
        return "a" * 65536
    return Nested(2000)


def sweep(model: type, base: dict) -> list[dict]:
    """The base body with each of the model's fields, one at a time, at its worst."""
    return [{**base, name: worst(name, str(f.annotation))} for name, f in sorted(model.model_fields.items())]


@pytest.fixture(scope="module")
def hostile_paths(llama_checkpoint, tmp_path_factory) -> list[str]:
    """Folders a careless or hostile client may name: weights that are a FIFO, NaN weights, an
    adapter whose file is a sparse GiB, an adapter with NaN weights."""
    root = tmp_path_factory.mktemp("hostile")
    fifo = Path(shutil.copytree(llama_checkpoint, root / "fifo"))
    (shard,) = fifo.glob("*.safetensors")
    shard.unlink()
    os.mkfifo(shard)
    nan = Path(shutil.copytree(llama_checkpoint, root / "nan"))
    (shard,) = nan.glob("*.safetensors")
    tensors = load_file(shard)
    tensors["model.norm.weight"][0] = float("nan")
    save_file(tensors, shard, metadata={"format": "pt"})
    sparse = make_adapter(llama_checkpoint, root / "sparse", ["q_proj"])
    with open(sparse / "adapter_model.safetensors", "r+b") as f:
        f.truncate(1 << 30)
    nan_adapter = make_adapter(llama_checkpoint, root / "nan-adapter", ["v_proj"])
    tensors = load_file(nan_adapter / "adapter_model.safetensors")
    next(iter(tensors.values()))[0, 0] = float("nan")
    save_file(tensors, nan_adapter / "adapter_model.safetensors")
    return [str(fifo), str(nan), str(sparse), str(nan_adapter)]


class HealthWatch:
    """Polls /health in a thread for as long as the fuzzing runs, keeping the slowest answer."""

    def __init__(self, url: str):
        self.url, self.slowest, self.failures = url, 0.0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                status = httpx.get(f"{self.url}/health", timeout=HEALTH_BOUND_S * 2).status_code
            except httpx.HTTPError as exc:
                status = repr(exc)
            self.slowest = max(self.slowest, time.monotonic() - started)
            if status not in (200, 503):  # 503 while asleep
                self.failures.append(status)
            self._stop.wait(0.05)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def fuzzed(llama_checkpoint) -> Iterator[tuple[RunningServer, HealthWatch]]:
    with (
        run_server(llama_checkpoint, **EVERY_SURFACE_ON, max_model_len=64) as server,
        HealthWatch(server.url) as health,
    ):
        yield server, health


def settle(server: RunningServer) -> None:
    """Nothing stays in flight or counted, and a weight change (sleep, wake-up) completes."""
    deadline = time.monotonic() + 30
    while server.engine.num_in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.engine.num_in_flight == 0
    counted = server.metrics(("argosy_num_requests_waiting", "argosy_num_requests_running"))
    assert set(counted.values()) == {0}, counted
    assert httpx.post(f"{server.url}/sleep?level=1", timeout=30).status_code == 200
    assert httpx.post(f"{server.url}/wake_up", timeout=30).status_code == 200


def send(server: RunningServer, path: str, body: dict) -> int:
    """The status of the answer, a stream read to its end."""
    headers = {"content-type": "application/json"}
    with httpx.stream("POST", f"{server.url}{path}", content=body_text(body), headers=headers, timeout=60) as answer:
        for _ in answer.iter_bytes():
            pass
        return answer.status_code


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_no_request_gets_a_5xx_or_leaves_a_trace(fuzzed, hostile_paths, path):
    server, _ = fuzzed
    model, base = ENDPOINTS[path]

    @seed(20261204)
    @FUZZING
    @given(body=mutations(model, base, hostile_paths))
    def case(body: dict) -> None:
        status = send(server, path, body)
        assert status < 500, (path, body, status)
        settle(server)

    for body in sweep(model, base):  # every field once at its type's worst, then the drawn cases
        case = example(body=body)(case)
    case()


@seed(20261204)
@FUZZING
@given(level=extremes([]))
def test_sleep_levels_are_4xx_unless_served(fuzzed, level):
    server, _ = fuzzed
    answer = httpx.post(f"{server.url}/sleep", params={"level": str(level)[:1000]}, timeout=30)
    assert answer.status_code < 500
    if answer.status_code == 200:
        assert httpx.post(f"{server.url}/wake_up", timeout=30).status_code == 200
    settle(server)


def test_health_answered_within_the_bound_all_along(fuzzed):
    """Last in the module: the watch has seen every case above."""
    _, health = fuzzed
    assert health.failures == [] and health.slowest < HEALTH_BOUND_S, (health.failures, health.slowest)
