from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server.api.servers import RunningServer, run_server


@pytest.fixture(scope="module")
def server(llama_checkpoint) -> Iterator[RunningServer]:
    with run_server(llama_checkpoint) as running:
        yield running


@pytest.fixture(scope="module")
def default_server():
    """The embedded default model (SmolLM2-135M-Instruct), whose answers mean something."""
    with run_server(
        None, served_model_name="default", dtype="auto", max_model_len=1024, kv_cache_memory=64 << 20
    ) as running:
        yield running
