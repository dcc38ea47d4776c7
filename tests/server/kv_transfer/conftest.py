"""Two real servers with the P/D connector, sharing an adapter, prefilling in chunks of 64 tokens:
one the prefill side (its holds expire after 5 s), one the decode side (its pulls wait 3 s)."""

from __future__ import annotations

import pytest

from tests.adapters import make_adapter
from tests.server.api.servers import run_server
from tests.server.kv_transfer.pd_servers import transfer_config


@pytest.fixture(scope="module")
def pair(llama_checkpoint, tmp_path_factory):
    adapter = make_adapter(llama_checkpoint, tmp_path_factory.mktemp("adapter") / "tuned", rank=4)
    # Chunks of 64 tokens: every prompt here is prefilled in several.
    common = {"enable_lora": True, "max_loras": 1, "lora_modules": [f"tuned={adapter}"], "max_num_batched_tokens": 64}
    with (
        run_server(llama_checkpoint, kv_transfer_config=transfer_config(hold_timeout=5), **common) as prefill,
        run_server(llama_checkpoint, kv_transfer_config=transfer_config(pull_timeout=3), **common) as decode,
    ):
        yield prefill, decode
