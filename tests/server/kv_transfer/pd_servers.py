"""What the P/D tests share: the prefill leg's params as the vLLM router sends them, and a P/D
connector's configuration with a free side-channel port."""

from __future__ import annotations

import json

PREFILL_LEG = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
               "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


def transfer_config(connector: str = "ZmqConnector", **extra) -> str:
    extra = {"side_channel_port": 0, **extra}
    return json.dumps({"kv_connector": connector, "kv_role": "kv_both", "kv_connector_extra_config": extra})
