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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import kmock

from argosy.operator.labels import selector_labels
from argosy.operator.owner import Owner
from argosy.operator.router import router_args
from argosy.operator.spec import RouterSpec
from tests.operator.cluster import NS, eventually, patch
from tests.processes import MODEL, free_port
from tests.server.api.servers import metric, run_server
from tests.vllm_router import ANSI, needs_router

PODS = kmock.resource("", "v1", "pods")


def with_port(args: list[str], flag: str, value: int) -> list[str]:
    args = list(args)
    args[args.index(flag) + 1] = str(value)
    return args


async def add_ready_pod(cluster, name: str, labels: dict[str, str], ip: str = "127.0.0.1") -> dict:
    """A pod with these labels, then marked running and ready at `ip`, as the kubelet does; its status."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "server", "image": "argosy"}]},
    }
    created = await cluster.post(f"/api/v1/namespaces/{NS}/pods", json=pod)
    assert created.status == 200, await created.text()
    ready = {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}
    await patch(cluster, PODS, name, {"status": ready}, subresource="status")
    return ready


@contextmanager
def operator_router(args: list[str], server_port: int, log: Path) -> Iterator[tuple[str, Callable[[], str]]]:
    """The router with the operator's arguments, only its ports moved to free ones on loopback: its URL
    and its log so far."""
    port = free_port()
    args = with_port(router_args_ports(args, port), "--service-discovery-port", server_port)
    args[args.index("--host") + 1] = "127.0.0.1"
    command = [shutil.which("vllm-router"), *args, "--log-level", "debug"]
    router = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}", lambda: ANSI.sub("", log.read_text())
    finally:
        router.terminate()
        router.wait(10)


def router_args_ports(args: list[str], port: int) -> list[str]:
    return with_port(with_port(args, "--port", port), "--prometheus-port", free_port())


@needs_router
async def test_the_router_discovers_the_servers_pod_and_its_events(cluster, llama_checkpoint, tmp_path):
    owner = Owner(name="llama", namespace=NS, uid="u")
    events = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{free_port()}"})
    with run_server(llama_checkpoint, kv_events_config=events) as replica:
        ready = await add_ready_pod(cluster, "llama-0", selector_labels(owner))
        replica_port = int(replica.url.rpartition(":")[2])
        with operator_router(router_args(owner, RouterSpec()), replica_port, tmp_path / "router.log") as (url, text):
            await eventually(lambda: "spawned subscriber" in text(), 60, "the router to find the pod's events")
            async with httpx.AsyncClient(timeout=60) as client:
                body = {"model": MODEL, "prompt": "routed " * 20, "max_tokens": 2}
                answer = await client.post(f"{url}/v1/completions", json=body)
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


@needs_router
async def test_the_pd_router_finds_each_roles_pod_and_serves_through_both(cluster, llama_checkpoint, tmp_path):
    """Two pods on one port, as in a cluster: each server on its own loopback address (its pod IP)."""
    owner, port = Owner(name="llama", namespace=NS, uid="u"), free_port()
    ips = {"prefill": "127.0.0.2", "decode": "127.0.0.3"}

    def serve(role: str):
        extra = {"side_channel_host": ips[role], "side_channel_port": 0}
        transfer = json.dumps({"kv_role": "kv_both", "kv_connector_extra_config": extra})
        return run_server(llama_checkpoint, host=ips[role], port=port, kv_transfer_config=transfer)

    with serve("prefill") as prefill, serve("decode") as decode:
        for role, ip in ips.items():
            await add_ready_pod(cluster, f"llama-{role}-0", selector_labels(owner.as_role(role)), ip)
        args = router_args(owner, RouterSpec(policy="round_robin"), disaggregated=True)
        with operator_router(args, port, tmp_path / "router.log") as (url, text):
            await eventually(lambda: text().count("Adding pod: llama-") == 2, 60, "the router to find both roles")
            body = {"model": MODEL, "prompt": "disaggregated " * 8, "max_tokens": 6, "temperature": 0}
            async with httpx.AsyncClient(timeout=60) as client:
                alone = (await client.post(f"{prefill.url}/v1/completions", json=body)).json()
                answer = await client.post(f"{url}/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["text"] == alone["choices"][0]["text"]
            pulled = metric(decode.url, "argosy_kv_transfer_blocks_total", direction="pulled")
            assert pulled == (alone["usage"]["prompt_tokens"] - 1) // 16  # all but the last token's block, from the
            assert metric(prefill.url, "argosy_kv_transfer_blocks_total", direction="sent") == pulled  # prefill pod
