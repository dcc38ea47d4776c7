"""The router as the operator runs it, for real: the vllm-router binary with the operator's own
arguments (only the ports moved to free ones on loopback), its pod discovery pointed at the API
emulator. It finds the ready pod carrying the servers' labels (a real `argosy serve` replica on
loopback), asks it where its KV events are, subscribes, and serves a completion through it; when
the pod stops being ready, the router drops it and its event subscription."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import httpx
import kmock
import pytest

from argosy.operator.labels import selector_labels
from argosy.operator.owner import Owner
from argosy.operator.router import router_args
from argosy.operator.spec import RouterSpec
from tests.operator.cluster import NS, eventually, patch
from tests.processes import MODEL, free_port
from tests.server.api.servers import run_server

PODS = kmock.resource("", "v1", "pods")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def with_port(args: list[str], flag: str, value: int) -> list[str]:
    args = list(args)
    args[args.index(flag) + 1] = str(value)
    return args


@pytest.mark.skipif(shutil.which("vllm-router") is None, reason="the vllm-router package is part of the test extra")
async def test_the_router_discovers_the_servers_pod_and_its_events(cluster, llama_checkpoint, tmp_path):
    owner = Owner(name="llama", namespace=NS, uid="u")
    events = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{free_port()}"})
    with run_server(llama_checkpoint, kv_events_config=events) as replica:
        replica_port, port = int(replica.url.rpartition(":")[2]), free_port()
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "llama-0", "namespace": NS, "labels": selector_labels(owner)},
            "spec": {"containers": [{"name": "server", "image": "argosy"}]},
        }
        created = await cluster.post(f"/api/v1/namespaces/{NS}/pods", json=pod)
        assert created.status == 200, await created.text()
        ready = {"phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}
        await patch(cluster, PODS, "llama-0", {"status": ready}, subresource="status")  # as the kubelet does
        args = with_port(router_args(owner, RouterSpec()), "--service-discovery-port", replica_port)
        args = with_port(with_port(args, "--port", port), "--prometheus-port", free_port())
        args[args.index("--host") + 1] = "127.0.0.1"
        log = tmp_path / "router.log"
        command = [shutil.which("vllm-router"), *args, "--log-level", "debug"]
        router = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
        try:
            text = lambda: ANSI.sub("", log.read_text())  # noqa: E731
            await eventually(lambda: "spawned subscriber" in text(), 60, "the router to find the pod's events")
            async with httpx.AsyncClient(timeout=60) as client:
                body = {"model": MODEL, "prompt": "routed " * 20, "max_tokens": 2}
                answer = await client.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            unready = {"conditions": [{"type": "Ready", "status": "False"}]}  # the pod stops being ready
            await patch(cluster, PODS, "llama-0", {"status": unready}, subresource="status")
            removed = lambda: len(re.findall(r"Removing pod[^:]*: llama-0", text()))  # noqa: E731
            await eventually(lambda: removed() == 1, 30, "its removal when unready")
            await patch(cluster, PODS, "llama-0", {"status": ready}, subresource="status")
            await eventually(lambda: text().count("Adding pod: llama-0") == 2, 30, "its return when ready again")
            deleted = await cluster.delete(f"/api/v1/namespaces/{NS}/pods/llama-0")  # the replica is lost
            assert deleted.status == 200, await deleted.text()
            await eventually(lambda: removed() == 2, 30, "its removal when deleted")
        finally:
            router.terminate()
            router.wait(10)
