"""The `cluster` fixture: an emulated API server with the CRD (and the add-ons') served, and a
kubeconfig pointing at it."""

from __future__ import annotations

import kmock
import pytest
import yaml

from tests.operator.cluster import ADD_ONS, declare_resources, point_kopf_at
from tests.operator.emulator import ClusterEmulator


@pytest.fixture
async def cluster(tmp_path, monkeypatch):
    async with ClusterEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.failures = {}
        declare_resources(emulator, *ADD_ONS)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "emulator",
                    "clusters": [{"name": "emulator", "cluster": {"server": str(server.url).rstrip("/")}}],
                    "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}],
                    "users": [{"name": "tester", "user": {"token": "test-token"}}],
                }
            )
        )
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        point_kopf_at(emulator, str(server.url).rstrip("/"))
        yield emulator
