"""The agent under a quota, and its other sources. Under the quota: copies no longer wanted go
first, least recently used first; an unpinned ModelCache that does not fit waits with the
numbers; a pinned one evicts an unpinned copy no pod uses, never one in use. Sources: a
library claim the agent mounts, and another node's copy through its agent's file server."""

from __future__ import annotations

import os

from argosy.operator.model_cache.agent.file_server import FileServer
from argosy.operator.model_cache.agent.manifest import folder_manifest
from argosy.operator.model_cache.agent.store import MARKER
from argosy.operator.model_cache.nodes import AGENT_ADDRESS
from tests.operator.cluster import NS
from tests.operator.model_cache.harness import (
    agent_for,
    cache_path,
    entry,
    files_of,
    model_cache,
    passes_until,
)
from tests.operator.model_cache.source_server import SourceServer

SIZE = 10_000
HEADERS = {"Content-Type": "application/merge-patch+json"}


def pod_using(name: str, cache: str, root) -> dict:
    volume = {"name": "model", "hostPath": {"path": f"{root}/{NS}/{cache}"}}
    spec = {"nodeName": "node-a", "containers": [{"name": "server", "image": "argosy"}], "volumes": [volume]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


async def test_the_quota_evicts_in_its_order_and_says_what_does_not_fit(caches, tmp_path):
    folders = {}
    for name in "abcdep":
        folders[name] = tmp_path / "store" / name
        folders[name].mkdir(parents=True)
        (folders[name] / "weights.bin").write_bytes(os.urandom(SIZE))
    source = SourceServer(tmp_path / "store")
    root = tmp_path / "node-a"
    agent = agent_for(root, quota_bytes=int(2.5 * SIZE))
    held = lambda name: (root / NS / name / MARKER).exists()  # noqa: E731

    async def apply(name: str, **spec) -> None:
        await caches.post(cache_path(), json=model_cache(name, f"{source.url}/{name}", files_of(folders[name]), **spec))

    async def ready(name: str) -> None:
        await passes_until(agent, lambda: entry(caches, name)["phase"] == "Ready", f"{name} ready")

    for name in "ab":
        await apply(name)
        await ready(name)
    await caches.post(f"/api/v1/namespaces/{NS}/pods", json=pod_using("reader", "b", root))
    await passes_until(
        agent, lambda: (root / NS / "b" / MARKER).stat().st_mtime > (root / NS / "a" / MARKER).stat().st_mtime, "b used"
    )
    await caches.delete(f"/api/v1/namespaces/{NS}/pods/reader")
    for name in "ab":
        await caches.delete(cache_path(name))  # both left on the node, a used least recently
    await apply("c")
    await ready("c")
    assert not held("a") and held("b")
    await apply("d")
    await ready("d")
    assert not held("b")

    await apply("e")  # unpinned: it never evicts a wanted copy
    report = await passes_until(
        agent, lambda: entry(caches, "e")["reason"] == "QuotaExceeded" and entry(caches, "e"), "e waits"
    )
    assert report["phase"] == "Pending" and "needs 0.00 GB" in report["message"] and "llm/c" in report["message"]

    await caches.post(f"/api/v1/namespaces/{NS}/pods", json=pod_using("server", "d", root))
    await apply("p", pinned=True)  # pinned: it evicts c, which no pod uses, and not d
    await ready("p")
    assert held("d") and not held("c") and held("p")
    assert entry(caches, "c")["phase"] in ("Evicting", "Pending")
    report = await passes_until(
        agent, lambda: entry(caches, "c")["reason"] == "QuotaExceeded" and entry(caches, "c"), "c waits"
    )
    assert entry(caches, "e")["reason"] == "QuotaExceeded" and not held("e")
    source.close()


async def test_a_library_claim_mounted_in_the_agent_is_a_source(caches, store, tmp_path):
    libraries = tmp_path / "libraries"
    (libraries / "models").mkdir(parents=True)
    os.symlink(store.parent, libraries / "models" / "org")
    spec = {"source": {"persistentVolumeClaim": {"claimName": "models", "path": "org/llama"}}}
    await caches.post(cache_path(), json=model_cache("llama", "unused", files_of(store), **spec))
    spec = {"source": {"persistentVolumeClaim": {"claimName": "absent", "path": "llama"}}}
    await caches.post(cache_path(), json=model_cache("other", "unused", files_of(store), **spec))
    agent = agent_for(tmp_path / "node-a", library_root=libraries)
    await passes_until(agent, lambda: entry(caches, "llama")["phase"] == "Ready", "a ready copy")
    copy = tmp_path / "node-a" / NS / "llama"
    assert (copy / "model.safetensors").read_bytes() == (store / "model.safetensors").read_bytes()
    report = await passes_until(agent, lambda: entry(caches, "other").get("reason") and entry(caches, "other"), "x")
    assert (
        report["phase"] == "Failed"
        and report["reason"] == "ClaimNotMounted"
        and "agent.libraryClaims" in report["message"]
    )


async def test_another_nodes_copy_through_its_agent_is_a_source(caches, store, source, tmp_path):
    await caches.patch("/api/v1/nodes/node-a", json={"metadata": {"labels": {"role": "origin"}}}, headers=HEADERS)
    await caches.post(
        cache_path(), json=model_cache("llama", source.url, files_of(store), nodeSelector={"role": "origin"})
    )
    node_a = agent_for(tmp_path / "node-a")
    await passes_until(node_a, lambda: entry(caches, "llama")["phase"] == "Ready", "node-a's copy")
    server = FileServer(tmp_path / "node-a", host="127.0.0.1").start()
    await caches.patch(
        "/api/v1/nodes/node-a",
        json={"metadata": {"annotations": {AGENT_ADDRESS: f"127.0.0.1:{server.port}"}}},
        headers=HEADERS,
    )
    spec = {"source": {"node": {"name": "node-a", "path": f"{NS}/llama"}}, "nodeSelector": {"disk": "nvme"}}
    await caches.post(cache_path(), json=model_cache("fanned", "unused", files_of(store), **spec))
    node_b = agent_for(tmp_path / "node-b", node="node-b")
    served_before = len(source.served)
    await passes_until(node_b, lambda: entry(caches, "fanned", "node-b")["phase"] == "Ready", "node-b's copy")
    assert len(source.served) == served_before  # every byte came from node-a
    copy = tmp_path / "node-b" / NS / "fanned"
    assert folder_manifest(copy).digest == folder_manifest(store).digest
    server.close()
