"""The real vLLM router (the `vllm-router` package) in front of Argosy replicas on loopback, with its
`kv_aware` policy and nothing configured but the replicas' URLs: it finds each replica's event
source by asking it (/get_server_info, /kv_event_sources), subscribes, tokenizes through the
replica, and credits a prompt's cached prefix to the replica whose events announced it."""

from __future__ import annotations

import json
import re

import httpx

from tests.polling import wait_until
from tests.processes import MODEL, free_port
from tests.server.api.servers import run_server
from tests.vllm_router import needs_router, running_router

PROMPT = "Argosy routes each conversation to the replica that already holds its prefix. " * 4
DECISION = re.compile(r"KV prefix decision.*")


@needs_router
def test_the_vllm_router_indexes_a_replicas_events_and_credits_its_prefix(llama_checkpoint, tmp_path):
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{free_port()}"})
    with (
        run_server(llama_checkpoint, kv_events_config=config) as replica,
        running_router(tmp_path / "router.log", "--policy", "kv_aware", "--worker-urls", replica.url) as router,
    ):
        wait_until(lambda: "spawned subscriber" in router.log(), 30, "the router to subscribe to the replica")
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
        first = httpx.post(f"{router.url}/v1/completions", json=body, timeout=60)
        assert first.status_code == 200, first.text

        def credited() -> list[int]:
            found = [int(m) for m in re.findall(r"credited_prefix_tokens=(\d+)", router.log())]
            return [n for n in found if n > 0]

        for _ in range(20):  # until the first request's events have reached the router's index
            assert httpx.post(f"{router.url}/v1/completions", json=body, timeout=60).status_code == 200
            if credited():
                break
        assert credited(), DECISION.findall(router.log())[-3:]
        assert max(credited()) >= 16 * (len(replica.engine.tokenizer.encode(PROMPT)) // 16) - 16
