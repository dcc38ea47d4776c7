"""Scheduling over HTTP with the official client: the `priority` field (refused unless the
priority policy is on, and obeyed when it is: a later, more urgent request preempts and finishes
first), and the host KV tier's and the preemptions' series on /metrics."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from tests.polling import wait_until
from tests.processes import MODEL
from tests.server.api.servers import paused_core, run_server, stream_in_background
from tests.server.kv_tier.test_host_tier_engine import BLOCK_BYTES, CONVERSATION, GIB


def test_a_nonzero_priority_is_a_400_naming_the_field_under_fcfs(llama_checkpoint):
    with run_server(llama_checkpoint) as srv:
        client = srv.client()
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"priority": 3})
        error = caught.value.body
        assert error["param"] == "priority" and "--scheduling-policy priority" in error["message"]
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, extra_body={"priority": -1}
            )
        done = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"priority": 0})
        assert done.choices[0].finish_reason == "length"


def test_a_more_urgent_request_preempts_and_finishes_first(llama_checkpoint):
    with run_server(llama_checkpoint, scheduling_policy="priority", max_num_seqs=1) as srv:
        finished: list[str] = []
        results: list = []
        started = threading.Event()
        low = stream_in_background(srv.url, 300, results, started, priority=5)
        assert started.wait(60)
        client = srv.client()

        def urgent() -> None:
            out = client.completions.create(model=MODEL, prompt="now", max_tokens=4, extra_body={"priority": 0})
            finished.append(out.choices[0].finish_reason)

        with paused_core(srv):
            high = threading.Thread(target=urgent)
            high.start()
            wait_until(lambda: srv.engine.num_waiting == 1, 30, "the urgent request to wait")
        high.join(60)
        assert finished == ["length"] and low.is_alive()  # the low one still had most of its tokens to go
        low.join(60)
        tokens = [event for event in results[0] if event != "[DONE]"]
        assert len(tokens) == 300
        assert srv.metric("argosy_num_preemptions_total", cause="priority") == 1
        assert srv.metric("argosy_num_preemptions_total", cause="memory") == 0


def test_the_host_tier_reports_its_blocks_and_hits(llama_checkpoint):
    settings = {"kv_cache_memory": 30 * BLOCK_BYTES, "swap_space": 64 * BLOCK_BYTES / GIB, "max_model_len": 384}
    with run_server(llama_checkpoint, **settings) as srv:
        url = f"{srv.url}/v1/completions"
        body = {"model": MODEL, "max_tokens": 4}
        assert httpx.post(url, json={**body, "prompt": CONVERSATION}).status_code == 200
        for i in range(12):  # fills the device's cache with other prompts: the conversation's blocks leave it
            other = [(13 * i + j) % 290 + 3 for j in range(60)]
            assert httpx.post(url, json={**body, "prompt": other}).status_code == 200
        again = httpx.post(url, json={**body, "prompt": CONVERSATION}).json()
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
        host = srv.engine.stats().kv_host
        assert host.hit_tokens == 96 and host.blocks_loaded == 6
        assert srv.metric("argosy_kv_host_hits_total") == 96
        assert srv.metric("argosy_kv_host_blocks_loaded_total") == 6
        assert srv.metric("argosy_kv_host_blocks_stored_total") == host.blocks_stored > 0
        assert srv.metric("argosy_kv_host_usage_ratio") == host.blocks_used / 64 > 0
