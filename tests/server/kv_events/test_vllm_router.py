"""The real vLLM router (the `vllm-router` package) in front of Argosy replicas on loopback, with its
`kv_aware` policy and nothing configured but the replicas' URLs: it finds each replica's event
source by asking it (/get_server_info, /kv_event_sources), subscribes, tokenizes through the
replica, and credits a prompt's cached prefix to the replica whose events announced it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.polling import wait_until
from tests.processes import MODEL, free_port
from tests.server.api.servers import run_server

PROMPT = "Argosy routes each conversation to the replica that already holds its prefix. " * 4
DECISION = re.compile(r"KV prefix decision.*")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def router_log(log: Path) -> str:
    return ANSI.sub("", log.read_text())


def start_router(tmp_path: Path, workers: list[str], policy: str = "kv_aware") -> tuple[str, subprocess.Popen, Path]:
    port, log = free_port(), tmp_path / f"router-{policy}.log"
    command = [shutil.which("vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
               "--worker-urls", *workers, "--prometheus-port", str(free_port()), "--health-check-interval-secs", "1",
               "--log-level", "debug"]  # fmt: skip
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _up(url), 60, "the router to answer")
    return url, process, log


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.skipif(shutil.which("vllm-router") is None, reason="the vllm-router package is part of the test extra")
def test_the_vllm_router_indexes_a_replicas_events_and_credits_its_prefix(llama_checkpoint, tmp_path):
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{free_port()}"})
    with run_server(llama_checkpoint, kv_events_config=config) as replica:
        url, router, log = start_router(tmp_path, [replica.url])
        try:
            wait_until(lambda: "spawned subscriber" in router_log(log), 30, "the router to subscribe to the replica")
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
            first = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert first.status_code == 200, first.text

            def credited() -> list[int]:
                found = [int(m) for m in re.findall(r"credited_prefix_tokens=(\d+)", router_log(log))]
                return [n for n in found if n > 0]

            for _ in range(20):  # until the first request's events have reached the router's index
                assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
                if credited():
                    break
            assert credited(), DECISION.findall(router_log(log))[-3:]
            assert max(credited()) >= 16 * (len(replica.engine.tokenizer.encode(PROMPT)) // 16) - 16
        finally:
            router.terminate()
            router.wait(10)
