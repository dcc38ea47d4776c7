"""What the model cache's tests share: ModelCache objects, reading the emulated cluster, and
agents with temporary folders as their nodes' disks, run pass by pass."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import kmock

from argosy.operator.kube import KubeClient
from argosy.operator.model_cache.agent.agent import Agent, AgentConfig
from argosy.operator.model_cache.agent.manifest import folder_manifest
from tests.operator.cluster import MODEL_CACHES, NS, live, path
from tests.polling import NOT_YET

NODES = kmock.resource("", "v1", "nodes")


def files_of(folder: Path) -> list[dict[str, Any]]:
    return [f.model_dump() for f in folder_manifest(folder).files]


def model_cache(name: str, url: str, files=None, **spec: Any) -> dict[str, Any]:
    body = {"source": {"http": {"url": url}}, "nodeSelector": {"disk": "nvme"}, **spec}
    if files is not None:
        body["files"] = files
    return {
        "apiVersion": "argosy.dev/v1alpha1",
        "kind": "ModelCache",
        "metadata": {"name": name, "namespace": NS},
        "spec": body,
    }


def cache_path(name: str | None = None) -> str:
    return path(MODEL_CACHES, name)


def entry(cluster, name: str, node: str = "node-a") -> dict[str, Any]:
    return live(cluster, MODEL_CACHES, name)["status"]["nodes"][node]


def agent_for(root: Path, node: str = "node-a", **settings: Any) -> Agent:
    settings = {"retry_base_seconds": 0.1, "retry_max_seconds": 0.4, **settings}
    return Agent(KubeClient.from_environment(), AgentConfig(node, root, **settings))


async def passes_until(agent: Agent, check, what: str, timeout: float = 30.0, seen: list | None = None):
    """Runs the agent's passes until `check()` holds; `seen` collects the result of each check."""
    deadline = time.monotonic() + timeout
    while True:
        await asyncio.to_thread(agent.run_once)
        try:
            result = check()
        except NOT_YET:
            result = None
        if seen is not None:
            seen.append(result)
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def secret(name: str, **data: str) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS}, "data": encoded}
