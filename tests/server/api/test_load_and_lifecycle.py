"""Many clients at once, clients that leave, a full waiting queue, and the metrics that
report all of it."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import torch

from argosy import LLM, SamplingParams
from argosy.server.models.model_config import ModelConfig
from argosy.server.worker.memory_budget import kv_bytes_per_block
from tests.polling import wait_until
from tests.processes import MODEL
from tests.server.api.servers import paused_core, run_server, send_without_reading


async def stream_text(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> str:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    text = ""
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"] if json.loads(line[6:])["choices"] else ""
    return text


def test_64_concurrent_streams_equal_the_offline_engine(server, llama_checkpoint):
    prompts = [f"request {i}: " + "fox " * (i % 7) for i in range(64)]
    lengths = [4 + i % 13 for i in range(64)]
    offline = LLM(str(llama_checkpoint), dtype="float32").generate(
        prompts, [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    )

    async def run_all() -> list[str]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            return await asyncio.gather(*(stream_text(client, p, n) for p, n in zip(prompts, lengths)))

    assert asyncio.run(run_all()) == [o.outputs[0].text for o in offline]
    assert server.engine.stats().kv_blocks_used == 0
    assert server.metric("argosy_kv_cache_usage_ratio") == 0.0
    assert server.metric("argosy_num_requests_running") == 0.0


def test_a_client_that_disconnects_has_its_sequence_aborted(server):
    body = {"model": MODEL, "prompt": "long story", "max_tokens": 400, "stream": True, "ignore_eos": True}
    aborted_before = server.metric("argosy_request_success_total", finished_reason="abort")
    with httpx.Client(base_url=server.url, timeout=60) as client, ExitStack() as pause:
        with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            while not next(lines).startswith("data: "):
                pass
            pause.enter_context(paused_core(server))  # until the client has left
            assert server.engine.stats().num_running == 1 and server.engine.stats().kv_blocks_used > 0
        wait_until(lambda: server.engine.num_in_flight == 0, what="the server to see the client leave")
    wait_until(lambda: server.engine.stats().num_running == 0)
    assert server.engine.stats().kv_blocks_used == 0
    wait_until(lambda: server.metric("argosy_request_success_total", finished_reason="abort") == aborted_before + 1)


def test_a_non_streaming_client_that_disconnects_is_aborted_too(server, caplog):
    body = {"model": MODEL, "prompt": "long story", "max_tokens": 450, "ignore_eos": True}
    aborted_before = server.metric("argosy_request_success_total", finished_reason="abort")
    sock = send_without_reading(server.url, "/v1/completions", body)
    wait_until(lambda: server.engine.num_running == 1, what="the request to run")
    with paused_core(server):  # it cannot finish while the core is paused
        sock.close()
        wait_until(lambda: server.engine.num_in_flight == 0, what="the server to see the client leave")
    wait_until(lambda: server.engine.stats().num_running == 0 and server.engine.stats().kv_blocks_used == 0)
    wait_until(lambda: server.metric("argosy_request_success_total", finished_reason="abort") == aborted_before + 1)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # a client leaving is no server error


def test_full_waiting_queue_answers_503_at_once_and_metrics_follow(llama_checkpoint):
    with run_server(llama_checkpoint, max_num_seqs=1, max_waiting_requests=2) as srv:
        tokens_before = srv.metric("argosy_generation_tokens_total")
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 400, "ignore_eos": True}
        results: list[httpx.Response] = []

        def post() -> None:
            results.append(httpx.post(f"{srv.url}/v1/completions", json=body, timeout=120))

        threads = [threading.Thread(target=post) for _ in range(3)]  # one running, two waiting
        threads[0].start()
        wait_until(lambda: srv.engine.num_running == 1, what="the first request to run")
        with paused_core(srv):
            for t in threads[1:]:
                t.start()
            wait_until(lambda: srv.engine.num_waiting == 2)
            assert srv.metric("argosy_num_requests_waiting") == 2
            # Answered while the engine is held: the refusal waited for nothing.
            rejected = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=10)
            assert rejected.status_code == 503 and rejected.headers["retry-after"] == "1"
            assert rejected.json()["error"]["code"] == "overloaded"
            assert all(t.is_alive() for t in threads)
        for t in threads:
            t.join()
        assert [r.status_code for r in results] == [200, 200, 200]
        assert srv.metric("argosy_num_requests_waiting") == 0
        served = sum(r.json()["usage"]["completion_tokens"] for r in results)
        assert served == 1200
        assert srv.metric("argosy_generation_tokens_total") - tokens_before == served
        prompt_tokens = sum(r.json()["usage"]["prompt_tokens"] for r in results)
        assert srv.metric("argosy_prompt_tokens_total") == prompt_tokens
        assert srv.metric("argosy_time_to_first_token_seconds_count") == 3
        assert srv.metric("argosy_e2e_request_latency_seconds_count") == 3
        assert srv.metric("argosy_request_queue_time_seconds_count") == 3
        assert srv.metric("argosy_inter_token_latency_seconds_count") == 3 * 399
        assert srv.metric("argosy_request_success_total", finished_reason="length") == 3
        assert srv.metric("argosy_request_queue_time_seconds_sum") > 0


def test_the_waiting_limit_counts_prompts_and_a_call_is_queued_whole_or_not_at_all(llama_checkpoint):
    with run_server(llama_checkpoint, max_num_seqs=1, max_waiting_requests=4) as srv:
        url = f"{srv.url}/v1/completions"
        body = {"model": MODEL, "max_tokens": 2}
        # Five prompts can never fit a queue of four, even on an idle server: 400, not a retry.
        never = httpx.post(url, json={**body, "prompt": ["a", "b", "c", "d", "e"]})
        assert never.status_code == 400 and never.json()["error"]["param"] == "prompt"
        assert httpx.post(url, json={**body, "prompt": ["a", "b", "c", "d"]}).status_code == 200
        aborted = srv.metric("argosy_request_success_total", finished_reason="abort")
        with paused_core(srv):
            held = threading.Thread(
                target=lambda: httpx.post(url, json={**body, "prompt": ["x", "y", "z"]}, timeout=60)
            )
            held.start()
            wait_until(lambda: srv.engine.num_waiting == 3)
            # Two more do not fit now: refused whole, nothing queued, nothing counted as finished.
            busy = httpx.post(url, json={**body, "prompt": ["p", "q"]}, timeout=10)
            assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
            assert srv.engine.num_waiting == 3 and srv.metric("argosy_num_requests_waiting") == 3
        held.join(60)
        assert srv.metric("argosy_request_success_total", finished_reason="abort") == aborted


def test_prefix_cache_and_preemption_counters(llama_checkpoint):
    # 24 blocks of 16 tokens (one max_model_len sequence) cannot hold six sequences of 40 + 100
    # tokens at once: some are preempted.
    block_bytes = kv_bytes_per_block(ModelConfig.from_folder(llama_checkpoint), 16, torch.float32)
    with run_server(llama_checkpoint, kv_cache_memory=24 * block_bytes, max_model_len=384) as srv:
        body = {"model": MODEL, "prompt": "fox " * 40, "max_tokens": 2}
        for _ in range(2):
            assert httpx.post(f"{srv.url}/v1/completions", json=body).status_code == 200
        with ThreadPoolExecutor(6) as pool:
            long = {**body, "max_tokens": 100, "ignore_eos": True}
            responses = list(
                pool.map(lambda _: httpx.post(f"{srv.url}/v1/completions", json=long, timeout=120), range(6))
            )
        assert [r.status_code for r in responses] == [200] * 6
        stats = srv.engine.stats()
        assert stats.num_preemptions > 0
        assert srv.metric("argosy_prefix_cache_queries_total") == stats.prefix_cache_queries > 0
        assert srv.metric("argosy_prefix_cache_hits_total") == stats.prefix_cache_hits > 0
        assert srv.metric("vllm:num_preemptions_total") == stats.num_preemptions
        assert srv.metric("argosy_num_preemptions_total", cause="memory") == stats.preemptions["memory"]
