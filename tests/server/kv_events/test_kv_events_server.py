"""A replica with KV events on, over HTTP: it tells routers what they ask (/server_info and its
vLLM-router name, /kv_event_sources with the port it bound, /v1/models with how blocks are hashed),
and a completion's blocks arrive with the hashes a consumer computes from that description and the
prompt's tokens from /tokenize (unknown fields ignored, as vLLM does); `argosy kv-events` checks a
prompt's blocks against a server and prints the stream."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import httpx
import pytest

from argosy.server.engine.block_hash import BlockHasher
from argosy.server.kv_events.inspect_command import block_hashes, report
from argosy.server.kv_events.wire import BlockStored
from tests.polling import wait_until
from tests.processes import MODEL
from tests.server.api.servers import run_server
from tests.server.kv_events.vllm_subscriber import Subscriber, chain

PROMPT = "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun " * 2


@pytest.fixture(scope="module")
def events_server(llama_checkpoint):
    config = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*", "replay_endpoint": "tcp://127.0.0.1:*"}
    with run_server(llama_checkpoint, kv_events_config=json.dumps(config)) as running:
        yield running


def test_it_tells_routers_its_model_block_size_hashing_and_event_sources(events_server):
    url = events_server.url
    info = httpx.get(f"{url}/server_info").json()
    assert httpx.get(f"{url}/get_server_info").json() == info
    assert info["block_size"] == 16 and info["model"] == MODEL
    assert info["vllm_config"]["model_config"]["model"] == MODEL
    assert info["vllm_config"]["cache_config"]["block_size"] == 16
    assert info["vllm_config"]["cache_config"]["hash_function"] == "sha256"
    parallel = info["vllm_config"]["parallel_config"]
    assert parallel == {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1}
    sources = httpx.get(f"{url}/kv_event_sources").json()
    (source,) = sources.values()
    assert list(sources) == ["0"] and source["topic"] == "" and source["publisher"] == "zmq"
    assert source["endpoint"].startswith("tcp://127.0.0.1:") and not source["endpoint"].endswith(":*")
    assert source["replay_endpoint"] != source["endpoint"] and source["encoding"] == "msgpack"
    (card,) = httpx.get(f"{url}/v1/models").json()["data"]
    assert card["kv_cache"]["block_size"] == 16 and card["kv_cache"]["hash_seed"] == ""


def test_a_completions_blocks_arrive_with_the_hashes_a_consumer_computes(events_server):
    url = events_server.url
    sub = Subscriber(httpx.get(f"{url}/kv_event_sources").json()["0"]["endpoint"])
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    try:
        probes = iter(range(1000))  # each a new prompt: new blocks, new events
        sub.wait_connected(
            lambda: httpx.post(f"{url}/v1/completions", json={**body, "prompt": f"{next(probes)} " * 20})
        )
        sub.messages.clear()
        httpx.post(f"{url}/v1/completions", json=body).raise_for_status()
        # What the vLLM router sends /tokenize: a field this server does not know is ignored.
        tokens = httpx.post(f"{url}/tokenize", json={"model": MODEL, "prompt": PROMPT, "cache_salt": None}).json()
        expected = chain(tokens["tokens"], 16)
        stored = lambda: [h for e in sub.events() if e["type"] == "BlockStored" for h in e["block_hashes"]]  # noqa: E731
        sub.poll_until(lambda: set(expected) <= set(stored()), what="the prompt's blocks")
        assert stored()[-len(expected) :] == expected and len(expected) >= 2  # in order, the last stored
    finally:
        sub.close()


def test_tokenize_continues_a_final_assistant_message(events_server):
    url, tokenizer = events_server.url, events_server.engine.tokenizer
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello, I am"}]
    body = {"model": MODEL, "messages": messages, "continue_final_message": True}
    tokens = httpx.post(f"{url}/tokenize", json=body).json()["tokens"]
    text = tokenizer.decode(tokens, skip_special_tokens=False)
    assert text.endswith("Hello, I am") and text.startswith(tokenizer.apply_chat_template(messages[:1], False)[:10])
    both = httpx.post(f"{url}/tokenize", json={**body, "add_generation_prompt": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "add_generation_prompt"
    user_last = httpx.post(f"{url}/tokenize", json={**body, "messages": messages[:1]})
    assert user_last.status_code == 400 and user_last.json()["error"]["param"] == "messages"


def test_the_kv_events_tool_checks_a_prompts_blocks_and_prints_the_stream(events_server):
    url = events_server.url
    prompt = "A fleet whose hit rate is zero starts here: does each block arrive under its hash? " * 3
    command = [sys.executable, "-P", "-m", "argosy.cli", "kv-events", url, "--check", url, "--prompt", prompt]
    checked = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0 and "ok: all" in checked.stdout, checked.stdout + checked.stderr
    command = [sys.executable, "-P", "-m", "argosy.cli", "kv-events", url, "--seconds", "120"]
    watch = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(watch.stdout), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any(line.startswith("# subscribed") for line in lines), 60, "the tool to subscribe")
        body = {"model": MODEL, "prompt": "news " * 40, "max_tokens": 1}
        httpx.post(f"{url}/v1/completions", json=body).raise_for_status()
        stored = re.compile(r"^\d+ [\d.]+ BlockStored GPU parent=- blocks=\[[0-9a-f]{16}")
        wait_until(lambda: any(stored.match(line) for line in lines), 60, "the prompt's blocks to be printed")
    finally:
        watch.terminate()
        watch.wait(30)


def test_a_mismatch_of_hash_settings_is_named():
    tokens = list(range(32))
    other = BlockStored([1, 2], None, tokens, 16, None, "GPU", None)
    expected = block_hashes(tokens, 16, BlockHasher())
    assert report(expected, {1, 2}, [other]) == 1
    assert report(expected, set(expected), []) == 0


def test_render_shows_what_a_call_would_hand_the_engine(events_server):
    url, tokenizer = events_server.url, events_server.engine.tokenizer
    messages = [{"role": "user", "content": "hello there"}]
    chat = httpx.post(f"{url}/v1/chat/completions/render", json={"model": MODEL, "messages": messages, "seed": 3})
    assert chat.status_code == 200, chat.text
    body = chat.json()
    assert body["token_ids"] == tokenizer.encode(tokenizer.apply_chat_template(messages), False)
    assert body["sampling_params"]["max_tokens"] == events_server.engine.max_model_len - len(body["token_ids"])
    prompts = {"model": MODEL, "prompt": ["one two", "three"], "max_tokens": 5}
    listed = httpx.post(f"{url}/v1/completions/render", json=prompts).json()
    assert [e["token_ids"] for e in listed] == [tokenizer.encode("one two"), tokenizer.encode("three")]
    assert {e["sampling_params"]["max_tokens"] for e in listed} == {5}
    bad = httpx.post(f"{url}/v1/completions/render", json={"model": MODEL, "prompt": "x", "max_tokens": 10**9})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    assert httpx.post(f"{url}/v1/completions/render", json={"model": "nope", "prompt": "x"}).status_code == 404
