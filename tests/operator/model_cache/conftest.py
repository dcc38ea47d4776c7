"""The model cache's fixtures: the emulated API server serving ModelCaches and two nodes, and a
store of model files behind a real HTTP server on loopback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.operator.model_cache.source_server import SourceServer


@pytest.fixture
async def caches(cluster):
    for name in ("node-a", "node-b"):
        await cluster.post("/api/v1/nodes", json={"metadata": {"name": name, "labels": {"disk": "nvme"}}})
    return cluster


@pytest.fixture
def store(tmp_path) -> Path:
    """A model's files, as a store holds them."""
    folder = tmp_path / "store" / "llama"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(os.urandom(3 << 20))
    (folder / "tokenizer" / "tokenizer.json").parent.mkdir()
    (folder / "tokenizer" / "tokenizer.json").write_text('{"version": "1.0"}')
    return folder


@pytest.fixture
def source(store):
    server = SourceServer(store)
    yield server
    server.close()
