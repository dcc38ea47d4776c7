"""Weights for an RL loop on a real server: /v1/update_weights_from_disk swaps in a checkpoint
(afterwards the answers are a fresh server's on it), all or nothing (a mismatched checkpoint is
a 400 and the old weights keep answering), waiting for the requests in flight or aborting them,
one at a time (409); every response names its weights; sleep frees memory and answers 503 until
wake-up. The engine core is paused (SIGSTOP) where a test needs a request to be certainly in
flight."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from argosy import LLM, SamplingParams
from tests.checkpoints import build_checkpoint
from tests.polling import wait_until
from tests.processes import MODEL
from tests.server.api.servers import paused_core, run_server, stream_in_background

PROMPT = "once upon a time"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("trained") / "llama", "llama", seed=7)


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    with run_server(llama_checkpoint, enable_weight_updates=True, enable_sleep_mode=True) as running:
        yield running


def expected(checkpoint, max_tokens: int = 12) -> str:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return LLM(str(checkpoint), dtype="float32").generate(PROMPT, params)[0].outputs[0].text


def complete(url: str, max_tokens: int = 12) -> httpx.Response:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def update(url: str, path, **extra) -> httpx.Response:
    return httpx.post(f"{url}/v1/update_weights_from_disk", json={"model_path": str(path), **extra}, timeout=60)


def in_background(call) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    return thread, result


def events(results: list) -> list[dict]:
    return [json.loads(e) for e in results[0] if e != "[DONE]"]


def test_an_update_serves_the_new_weights_and_every_response_names_them(server, llama_checkpoint, trained):
    url = server.url
    with run_server(trained) as fresh:
        fresh_text = complete(fresh.url).json()["choices"][0]["text"]
    before = complete(url)
    assert before.json()["weight_version"] == before.headers["X-Weight-Version"]
    answer = update(url, trained, weight_version="step-1")
    assert answer.status_code == 200 and answer.json() == {"weight_version": "step-1", "num_aborted_requests": 0}
    after = complete(url)
    assert after.json()["choices"][0]["text"] == fresh_text != before.json()["choices"][0]["text"]
    assert after.json()["weight_version"] == after.headers["X-Weight-Version"] == "step-1"
    base = server.client().models.list().data[0]
    assert base.model_extra["weight_version"] == "step-1"
    assert server.metric("argosy_weight_version", version="step-1") >= 1
    assert update(url, llama_checkpoint).json()["weight_version"] != "step-1"  # the count, by default
    assert complete(url).json()["choices"][0]["text"] == expected(llama_checkpoint)


def test_a_mismatched_checkpoint_is_a_400_and_the_old_weights_keep_serving(server, tmp_path):
    url = server.url
    before = complete(url).json()
    wrong = build_checkpoint(tmp_path / "wrong", "llama", seed=3, intermediate_size=96)
    answer = update(url, wrong)
    assert answer.status_code == 400, answer.text
    assert "mlp.gate_proj.weight" in answer.json()["error"]["message"]
    assert update(url, tmp_path / "nowhere").status_code == 400
    after = complete(url).json()
    assert (after["choices"][0]["text"], after["weight_version"]) == (
        before["choices"][0]["text"],
        before["weight_version"],
    )


def test_abort_ends_the_requests_in_flight_with_finish_reason_abort(server, trained, llama_checkpoint):
    url = server.url
    results, started = [], threading.Event()
    stream = stream_in_background(url, 400, results, started, temperature=0)
    assert started.wait(60)
    with paused_core(server):  # the stream is certainly still running
        updating, answer = in_background(lambda: update(url, trained, mode="abort"))
        stream.join(30)
        assert events(results)[-1]["choices"][0]["finish_reason"] == "abort"
    updating.join(60)
    assert answer[0].status_code == 200 and answer[0].json()["num_aborted_requests"] == 1
    assert complete(url).json()["choices"][0]["text"] == expected(trained)
    update(url, llama_checkpoint)


def test_wait_lets_requests_finish_on_the_old_weights_and_a_second_update_is_a_409(server, trained, llama_checkpoint):
    url = server.url
    old_version = complete(url).json()["weight_version"]
    results, started = [], threading.Event()
    stream = stream_in_background(url, 40, results, started, temperature=0)
    assert started.wait(60)
    with paused_core(server):
        updating, answer = in_background(lambda: update(url, trained))
        wait_until(lambda: server.state.weights.changing is not None, 30, "the update to start waiting")
        busy = complete(url)
        assert busy.status_code == 503 and busy.headers["Retry-After"]
        assert "updating the weights" in busy.json()["error"]["message"]
        assert update(url, trained).status_code == 409
    stream.join(60)
    updating.join(60)
    chunks = events(results)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == expected(llama_checkpoint, 40)
    assert {c["weight_version"] for c in chunks} == {old_version}
    assert answer[0].status_code == 200 and answer[0].json()["num_aborted_requests"] == 0
    assert complete(url).json()["weight_version"] == answer[0].json()["weight_version"] != old_version
    update(url, llama_checkpoint)


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_frees_memory_and_answers_503_until_wake_up(server, level):
    url = server.url
    before = complete(url).json()["choices"][0]["text"]
    answer = httpx.post(f"{url}/sleep", params={"level": level}, timeout=60)
    assert answer.status_code == 200 and answer.json()["freed_bytes"] > 0
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": True}
    assert httpx.get(f"{url}/health").status_code == 503
    assert httpx.get(f"{url}/live").status_code == 200  # asleep is no reason to restart it
    asleep = complete(url)
    assert asleep.status_code == 503 and asleep.headers["Retry-After"] and "asleep" in asleep.text
    assert httpx.post(f"{url}/sleep", params={"level": 1}).status_code == 409
    assert httpx.post(f"{url}/wake_up", timeout=60).status_code == 200
    assert httpx.get(f"{url}/health").status_code == 200
    assert complete(url).json()["choices"][0]["text"] == before


def test_a_call_prepared_while_the_server_fell_asleep_gets_a_503_and_nothing_breaks(server, monkeypatch):
    url, inputs = server.url, server.engine.inputs
    tokenizing, release = threading.Event(), threading.Event()
    make_request = inputs.make_request

    def slow(*args, **kwargs):  # a long prompt: tokenized in a thread, past the first admission check
        tokenizing.set()
        release.wait(30)
        return make_request(*args, **kwargs)

    monkeypatch.setattr(inputs, "make_request", slow)
    calling, answer = in_background(lambda: complete(url))
    assert tokenizing.wait(30)
    assert httpx.post(f"{url}/sleep", params={"level": 2}, timeout=60).status_code == 200
    release.set()
    calling.join(60)
    assert answer[0].status_code == 503 and "asleep" in answer[0].json()["error"]["message"]
    monkeypatch.undo()
    assert httpx.post(f"{url}/wake_up", timeout=60).status_code == 200
    assert complete(url).status_code == 200


def test_an_update_while_asleep_brings_the_weights_back_but_not_the_cache(server, trained, llama_checkpoint):
    url = server.url
    assert httpx.post(f"{url}/sleep", params={"level": 2}, timeout=60).status_code == 200
    assert update(url, trained).status_code == 200
    assert httpx.get(f"{url}/health").status_code == 503  # still asleep: no KV cache
    assert httpx.post(f"{url}/sleep", params={"level": 2}, timeout=60).status_code == 200  # frees the new weights
    assert httpx.post(f"{url}/wake_up", timeout=60).status_code == 200
    assert complete(url).json()["choices"][0]["text"] == expected(trained)
    update(url, llama_checkpoint)


def test_the_endpoints_are_off_unless_enabled_and_behind_the_api_key(llama_checkpoint, trained):
    with run_server(llama_checkpoint, api_key="k") as plain:
        auth = {"Authorization": "Bearer k"}
        off = httpx.post(f"{plain.url}/v1/update_weights_from_disk", json={"model_path": str(trained)}, headers=auth)
        assert off.status_code == 404 and "--enable-weight-updates" in off.json()["error"]["message"]
        assert httpx.post(f"{plain.url}/sleep", headers=auth).status_code == 404
        assert httpx.post(f"{plain.url}/sleep").status_code == 401
        assert httpx.post(f"{plain.url}/v1/update_weights_from_disk", json={"model_path": "x"}).status_code == 401
