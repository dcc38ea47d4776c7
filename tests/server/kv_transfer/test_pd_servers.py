"""Prefill/decode disaggregation between two real servers (each its own engine core process): the
prefill leg, asked `do_remote_decode`, answers with where its prompt's blocks are held; the decode
leg, given that answer, pulls them and decodes, token for token what one server alone answers."""

from __future__ import annotations

import json
import os
import signal
from contextlib import contextmanager

import httpx
import pytest

from tests.polling import wait_until
from tests.processes import MODEL, children
from tests.server.api.servers import metric, run_server
from tests.server.kv_transfer.pd_servers import PREFILL_LEG, transfer_config

PROMPT = "The history of the river valley, told from its source to the sea: " * 6


POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "point", "schema": POINT}}


def complete(url: str, **body) -> dict:
    answer = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "temperature": 0, **body}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({}, id="plain"),
        pytest.param({"model": "tuned"}, id="adapter"),
        pytest.param({"response_format": SCHEMA, "max_tokens": 40}, id="json schema"),
    ],
)
def test_a_completion_through_prefill_and_decode_is_the_one_server_answer(pair, extra, request):
    prefill, decode = (server.url for server in pair)
    body = {"prompt": f"{request.node.callspec.id}: {PROMPT}", "max_tokens": 12, **extra}
    alone = complete(prefill, **body)
    assert "kv_transfer_params" not in alone
    first = complete(prefill, **{**body, "max_tokens": 1, "min_tokens": 1, "kv_transfer_params": PREFILL_LEG})
    params = first["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["remote_port"] and len(params["remote_block_ids"]) >= 4
    second = complete(decode, **body, kv_transfer_params=params)
    assert second["choices"][0]["text"] == alone["choices"][0]["text"]
    pullable = min(len(params["remote_block_ids"]), (second["usage"]["prompt_tokens"] - 1) // 16)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 16 * pullable


def test_a_streamed_chat_decode_leg_is_the_one_server_answer(pair):
    prefill, decode = (server.url for server in pair)
    messages = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "And then?"}]
    body = {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 10}
    alone = httpx.post(f"{prefill}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]
    leg = {**body, "max_tokens": 1, "min_tokens": 1, "kv_transfer_params": PREFILL_LEG}
    params = httpx.post(f"{prefill}/v1/chat/completions", json=leg, timeout=60).json()["kv_transfer_params"]
    pieces = []
    with httpx.stream(
        "POST", f"{decode}/v1/chat/completions", json={**body, "stream": True, "kv_transfer_params": params}, timeout=60
    ) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                pieces.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
    assert "".join(pieces) == alone["content"]


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda p: {**p, "remote_engine_id": "0" * 32}, id="unknown engine"),
        pytest.param(
            lambda p: {**p, "remote_block_ids": [b + 500 for b in p["remote_block_ids"]]}, id="blocks not held"
        ),
        pytest.param(lambda p: {**p, "remote_request_id": "cmpl-someone-else"}, id="another request"),
        pytest.param(lambda p: {**p, "hold_token": "0" * 64}, id="a forged token"),
        pytest.param(lambda p: {**p, "hold_deadline": p["hold_deadline"] + 3600}, id="a later deadline"),
    ],
)
def test_forged_params_are_a_400_and_read_nothing(pair, forge, request):
    prefill, decode = (server.url for server in pair)
    prompt = f"{request.node.callspec.id}: {PROMPT}"  # cached on neither side yet
    params = complete(prefill, prompt=prompt, max_tokens=1, kv_transfer_params=PREFILL_LEG)["kv_transfer_params"]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    answer = httpx.post(f"{decode}/v1/completions", json={**body, "kv_transfer_params": forge(params)}, timeout=60)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "kv_transfer_params", answer.text
    # The true params still pull: a refused pull took nothing, and the blocks are what the prompt's are.
    pulled = complete(decode, **body, kv_transfer_params=params)
    pullable = min(len(params["remote_block_ids"]), (pulled["usage"]["prompt_tokens"] - 1) // 16)
    assert pulled["usage"]["prompt_tokens_details"]["cached_tokens"] == 16 * pullable
    assert pulled["choices"][0]["text"] == complete(prefill, **body)["choices"][0]["text"]


def test_blocks_never_pulled_go_back_after_the_hold_timeout_and_their_params_are_then_a_400(pair):
    prefill, decode = (server.url for server in pair)
    prompt = f"never pulled: {PROMPT}"
    used = metric(prefill, "argosy_kv_cache_usage_ratio")
    expired = metric(prefill, "argosy_kv_transfer_holds_expired_total")
    params = complete(prefill, prompt=prompt, max_tokens=1, kv_transfer_params=PREFILL_LEG)["kv_transfer_params"]
    assert metric(prefill, "argosy_kv_cache_usage_ratio") > used  # held for the decode side
    # Back to at most the baseline (an earlier test's hold may expire too), counted as expired.
    wait_until(lambda: metric(prefill, "argosy_kv_cache_usage_ratio") <= used, 30, "the hold to expire")
    assert metric(prefill, "argosy_kv_transfer_holds_expired_total") > expired
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "kv_transfer_params": params}
    answer = httpx.post(f"{decode}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 400 and "has expired" in answer.json()["error"]["message"], answer.text


def test_a_pulled_hold_goes_back_at_once(pair):
    prefill, decode = (server.url for server in pair)
    prompt = f"pulled: {PROMPT}"
    used = metric(prefill, "argosy_kv_cache_usage_ratio")
    sent = metric(prefill, "argosy_kv_transfer_blocks_total", direction="sent")
    params = complete(prefill, prompt=prompt, max_tokens=1, kv_transfer_params=PREFILL_LEG)["kv_transfer_params"]
    pulled = complete(decode, prompt=prompt, max_tokens=2, kv_transfer_params=params)
    # At most the baseline: an earlier test's hold may expire meanwhile.
    wait_until(lambda: metric(prefill, "argosy_kv_cache_usage_ratio") <= used, 10, "the held blocks to go back")
    # All the prompt's full blocks but one whose last token the decode side computes for its logits.
    blocks = pulled["usage"]["prompt_tokens_details"]["cached_tokens"] // 16
    assert blocks >= len(params["remote_block_ids"]) - 1
    assert metric(prefill, "argosy_kv_transfer_blocks_total", direction="sent") == sent + blocks
    assert metric(decode, "argosy_kv_transfer_blocks_total", direction="pulled") >= blocks


@contextmanager
def stopped(pid: int):
    """The process and all its descendants stopped (SIGSTOP) until the block ends."""
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children(tree[-1])
    for each in tree:
        os.kill(each, signal.SIGSTOP)
    try:
        yield
    finally:
        for each in tree:
            os.kill(each, signal.SIGCONT)


def test_a_prefill_side_gone_quiet_costs_a_recomputation_not_the_answer(pair):
    prefill, decode = pair
    body = {"prompt": f"quiet: {PROMPT}", "max_tokens": 12}
    alone = complete(prefill.url, **body)
    params = complete(prefill.url, **{**body, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG})["kv_transfer_params"]
    used, failed = (
        metric(decode.url, "argosy_kv_cache_usage_ratio"),
        metric(decode.url, "argosy_kv_transfer_pulls_failed_total"),
    )
    with stopped(prefill.engine.core.pid):  # its side channel answers nothing (the decode side waits 3 s)
        answer = complete(decode.url, **body, kv_transfer_params=params)
    assert answer["choices"][0]["text"] == alone["choices"][0]["text"]
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert metric(decode.url, "argosy_kv_transfer_pulls_failed_total") == failed + 1
    assert metric(decode.url, "argosy_kv_cache_usage_ratio") == used  # the blocks taken for the pull came back


def test_a_decode_side_of_another_layout_is_refused_naming_it(pair, llama_checkpoint):
    prefill = pair[0].url
    body = {"prompt": f"layout: {PROMPT}", "max_tokens": 2}
    params = complete(prefill, **{**body, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG})["kv_transfer_params"]
    with run_server(llama_checkpoint, dtype="bfloat16", kv_transfer_config=transfer_config()) as other:
        answer = httpx.post(f"{other.url}/v1/completions", json={"model": MODEL, **body, "kv_transfer_params": params})
    assert answer.status_code == 400, answer.text
    assert "the KV layouts differ: dtype is float32 on the prefill side, bfloat16" in answer.json()["error"]["message"]


def test_a_decode_side_holding_the_prompt_already_lets_the_hold_go_without_pulling(pair):
    prefill, decode = (server.url for server in pair)
    body = {"prompt": f"cached on both: {PROMPT}", "max_tokens": 4}
    used, sent = (
        metric(prefill, "argosy_kv_cache_usage_ratio"),
        metric(prefill, "argosy_kv_transfer_blocks_total", direction="sent"),
    )
    params = complete(prefill, **{**body, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG})["kv_transfer_params"]
    alone = complete(decode, **body)  # the decode side computes the prompt itself first: now cached there
    again = complete(decode, **body, kv_transfer_params=params)
    assert again["choices"][0]["text"] == alone["choices"][0]["text"]
    wait_until(lambda: metric(prefill, "argosy_kv_cache_usage_ratio") <= used, 10, "the hold to be let go")
    assert metric(prefill, "argosy_kv_transfer_blocks_total", direction="sent") == sent  # nothing was pulled
