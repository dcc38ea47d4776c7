"""Two real servers with the P/D connector, sharing an adapter, prefilling in chunks of 64 tokens:
one the prefill side (its holds expire after 5 s), one the decode side (its pulls wait 3 s), each
publishing its KV events (for the router's kv_aware policy); once
with blocks over the side channel's socket (ZmqConnector), once read with NIXL (NixlConnector,
when installed)."""

from __future__ import annotations

import pytest

from argosy.server.kv_transfer.nixl_transport import nixl_api
from tests.adapters import make_adapter
from tests.server.api.servers import run_server
from tests.server.kv_transfer.pd_servers import transfer_config


def nixl_installed() -> bool:
    try:
        nixl_api()
    except ImportError:
        return False
    return True


CONNECTORS = [
    "ZmqConnector",
    pytest.param("NixlConnector", marks=pytest.mark.skipif(not nixl_installed(), reason="NIXL is not installed")),
]


@pytest.fixture(scope="module", params=CONNECTORS)
def pair(request, llama_checkpoint, tmp_path_factory):
    connector = request.param
    adapter = make_adapter(llama_checkpoint, tmp_path_factory.mktemp("adapter") / "tuned", rank=4)
    # Chunks of 64 tokens: every prompt here is prefilled in several.
    common = {"enable_lora": True, "max_loras": 1, "lora_modules": [f"tuned={adapter}"], "max_num_batched_tokens": 64,
              "kv_events_config": '{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:*"}'}  # fmt: skip
    prefill_config, decode_config = (
        transfer_config(connector, hold_timeout=5),
        transfer_config(connector, pull_timeout=3),
    )
    with (
        run_server(llama_checkpoint, kv_transfer_config=prefill_config, **common) as prefill,
        run_server(llama_checkpoint, kv_transfer_config=decode_config, **common) as decode,
    ):
        yield prefill, decode
