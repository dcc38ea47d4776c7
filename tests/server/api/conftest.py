from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server.api.servers import RunningServer, run_server


@pytest.fixture(scope="module")
def server(llama_checkpoint) -> Iterator[RunningServer]:
    with run_server(llama_checkpoint) as running:
        yield running
