"""Prefill/decode disaggregation between two real servers (each its own engine core process): the
prefill leg, asked `do_remote_decode`, answers with where its prompt's blocks are held; the decode
leg, given that answer, pulls them and decodes, token for token what one server alone answers."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.processes import MODEL
from tests.server.api.servers import run_server

PREFILL_LEG = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
               "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
PROMPT = "The history of the river valley, told from its source to the sea: " * 6


def transfer_config(**extra) -> str:
    return json.dumps({"kv_role": "kv_both", "kv_connector_extra_config": {"side_channel_port": 0, **extra}})


@pytest.fixture(scope="module")
def pair(llama_checkpoint):
    with (
        run_server(llama_checkpoint, kv_transfer_config=transfer_config(hold_timeout=5)) as prefill,
        run_server(llama_checkpoint, kv_transfer_config=transfer_config()) as decode,
    ):
        yield prefill.url, decode.url


def complete(url: str, **body) -> dict:
    answer = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "temperature": 0, **body}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_completion_through_prefill_and_decode_is_the_one_server_answer(pair):
    prefill, decode = pair
    alone = complete(prefill, prompt=PROMPT, max_tokens=12)
    assert "kv_transfer_params" not in alone
    first = complete(prefill, prompt=PROMPT, max_tokens=1, min_tokens=1, kv_transfer_params=PREFILL_LEG)
    params = first["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["remote_port"] and len(params["remote_block_ids"]) >= 4
    second = complete(decode, prompt=PROMPT, max_tokens=12, kv_transfer_params=params)
    assert second["choices"][0]["text"] == alone["choices"][0]["text"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 16 * len(params["remote_block_ids"])
