"""The agent in-process against the emulated API server, a temporary folder as its node's disk
and a real HTTP server on loopback as the source: it copies, verifies and labels; reports its
progress; catches a corrupted file and tries again; resumes what an agent killed midway left; reads
the manifest and a bearer token (making every call its RBAC grants, and no other); and leaves
a node that is no longer selected."""

from __future__ import annotations

import asyncio
import json
import sys

from argosy.operator.model_cache.agent import agent as agent_module
from argosy.operator.model_cache.agent import copier
from argosy.operator.model_cache.agent.manifest import folder_manifest
from argosy.operator.model_cache.agent.rbac import AGENT_RULES
from argosy.operator.model_cache.agent.store import MARKER, STAGING
from tests.operator.cluster import NS, calls_made
from tests.operator.model_cache.harness import (
    MODEL_CACHES,
    NODES,
    agent_for,
    cache_path,
    entry,
    files_of,
    live,
    model_cache,
    passes_until,
    secret,
)
from tests.polling import eventually

LABEL = "modelcache.argosy.dev/llm.llama"


def ready(cluster, name: str = "llama", node: str = "node-a"):
    return entry(cluster, name, node)["phase"] == "Ready"


async def test_a_copy_is_made_verified_labelled_and_left_when_the_node_is_deselected(caches, store, source, tmp_path):
    await caches.post(cache_path(), json=model_cache("llama", source.url, files_of(store)))
    agent = agent_for(tmp_path / "node-a")
    await passes_until(agent, lambda: ready(caches), "the copy to be ready")
    copy = tmp_path / "node-a" / NS / "llama"
    for f in folder_manifest(store).files:
        assert (copy / f.path).read_bytes() == (store / f.path).read_bytes()
    assert json.loads((copy / MARKER).read_text())["digest"] == folder_manifest(store).digest
    assert not any((tmp_path / "node-a" / STAGING).rglob("*.*"))
    total = folder_manifest(store).total
    report = entry(caches, "llama")
    assert (report["bytesDone"], report["bytesTotal"], report["attempts"]) == (total, total, 1)
    assert report["observedGeneration"] == 1 and report["lastTransitionTime"] and report.get("reason") is None
    assert live(caches, NODES, "node-a", None)["metadata"]["labels"][LABEL] == "ready"
    # The next pass finds it ready on disk without copying again.
    before = len(source.served)
    await passes_until(agent, lambda: ready(caches), "the copy to stay ready")
    assert len(source.served) == before

    await caches.patch(
        cache_path("llama"), json={"spec": {"nodeSelector": {"disk": "hdd"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )  # fmt: skip
    await passes_until(
        agent, lambda: "node-a" not in live(caches, MODEL_CACHES, "llama")["status"]["nodes"], "the entry to go"
    )
    assert LABEL not in live(caches, NODES, "node-a", None)["metadata"]["labels"]
    assert (copy / MARKER).exists()  # kept until its room is needed


async def test_progress_is_reported_while_copying(caches, store, source, tmp_path, monkeypatch):
    monkeypatch.setattr(agent_module, "PROGRESS_REPORT_SECONDS", 0.1)
    monkeypatch.setattr(copier, "RATE_WINDOW_SECONDS", 1.0)
    source.faults.seconds_per_mib = 1.0
    await caches.post(cache_path(), json=model_cache("llama", source.url, files_of(store)))
    agent = agent_for(tmp_path / "node-a")

    def moving():
        report = entry(caches, "llama")
        return (
            report["phase"] == "Copying"
            and 1 << 20 < report["bytesDone"] < report["bytesTotal"]
            and report["bytesPerSecond"]
        )

    report = await passes_until(agent, lambda: moving() and entry(caches, "llama"), "progress mid-copy")
    assert 100_000 < report["bytesPerSecond"] < 10 << 20  # about 1 MiB/s, as the source sends
    await passes_until(agent, lambda: ready(caches), "the copy to be ready")
    agent.close()


async def test_a_corrupted_file_is_caught_and_fetched_again(caches, store, source, tmp_path):
    source.faults.corrupt_once.add("model.safetensors")
    await caches.post(cache_path(), json=model_cache("llama", source.url, files_of(store)))
    agent = agent_for(tmp_path / "node-a")
    seen = []
    await passes_until(agent, lambda: ready(caches) or entry(caches, "llama")["reason"], "a ready copy", seen=seen)
    await passes_until(agent, lambda: ready(caches), "a ready copy", seen=seen)
    assert "ChecksumMismatch" in seen
    assert entry(caches, "llama")["attempts"] == 2
    copy = tmp_path / "node-a" / NS / "llama" / "model.safetensors"
    assert copy.read_bytes() == (store / "model.safetensors").read_bytes()
    # Only the bad file was fetched again; the others were verified where they lay.
    assert source.bytes_served("config.json") == (store / "config.json").stat().st_size


async def test_an_agent_killed_midway_leaves_a_copy_the_next_resumes(caches, store, source, tmp_path):
    source.faults.seconds_per_mib = 2.0
    await caches.post(cache_path(), json=model_cache("llama", source.url, files_of(store)))
    staged = tmp_path / "node-a" / STAGING / NS / "llama" / "model.safetensors"
    command = ["agent", "--node-name", "node-a", "--cache-root", str(tmp_path / "node-a"), "--port", "0"]
    first = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "argosy", *command, "--interval", "0.2",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await eventually(lambda: staged.exists() and staged.stat().st_size > 0, 60, "a part of the file")
    finally:
        first.kill()  # -9, mid-file
        await first.wait()
    held = staged.stat().st_size
    assert 0 < held < (store / "model.safetensors").stat().st_size
    source.faults.seconds_per_mib = 0.0
    second = agent_for(tmp_path / "node-a")
    await passes_until(second, lambda: ready(caches), "the resumed copy")
    asked = [s.range for s in source.served if s.path == "model.safetensors"]
    assert asked[-1] == f"bytes={held}-"
    copy = tmp_path / "node-a" / NS / "llama" / "model.safetensors"
    assert copy.read_bytes() == (store / "model.safetensors").read_bytes()


async def test_the_manifest_and_a_bearer_token_come_from_the_source_with_exactly_the_agents_rbac(
    caches, store, source, tmp_path
):
    (store / "manifest.json").write_text(folder_manifest(store).to_json())
    source.faults.token = "s3cret"
    await caches.post(f"/api/v1/namespaces/{NS}/secrets", json=secret("store-token", token="s3cret\n"))
    spec = {"manifestPath": "manifest.json", "source": {"http": {"url": source.url}}}
    spec["source"]["http"]["bearerTokenSecretRef"] = {"name": "store-token", "key": "token"}
    await caches.post(cache_path(), json=model_cache("llama", source.url, **spec))
    agent = agent_for(tmp_path / "node-a")
    await passes_until(agent, lambda: ready(caches), "the copy to be ready")
    assert not (tmp_path / "node-a" / NS / "llama" / "manifest.json").exists()  # not in its own manifest

    await caches.post(cache_path(), json=model_cache("other", source.url, manifestPath="manifest.json"))
    report = await passes_until(agent, lambda: entry(caches, "other").get("reason") and entry(caches, "other"), "x")
    assert report["phase"] == "Failed" and report["reason"] == "SourceError" and "401" in report["message"]
    granted = {(g, r, v) for g, resources, verbs in AGENT_RULES for r in resources for v in verbs}
    assert calls_made(caches) == granted  # every call granted, every grant used
