"""The real vLLM router in its P/D mode (`--vllm-pd-disaggregation`) in front of an Argosy prefill
replica and an Argosy decode replica: it sends the prefill leg, copies the answer's
`kv_transfer_params` into the decode leg, and the client gets, token for token, what one server
alone answers, from blocks the decode side pulled."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.processes import MODEL
from tests.server.api.servers import metric
from tests.vllm_router import needs_router, running_router

PROMPT = "A ledger of every shipment that left the northern warehouse this quarter, by region: " * 5


@needs_router
@pytest.mark.parametrize(("policy", "stream"), [("round_robin", False), ("round_robin", True), ("kv_aware", False)])
def test_the_vllm_router_drives_a_prefill_and_a_decode_replica(pair, tmp_path, policy, stream):
    """kv_aware (the operator's default policy) finds the prefill replica's KV events as it does a worker's."""
    prefill, decode = pair
    args = ["--vllm-pd-disaggregation", "--prefill", prefill.url, "--decode", decode.url, "--policy", policy]
    body = {"model": MODEL, "prompt": f"{policy} {stream}: {PROMPT}", "max_tokens": 10, "temperature": 0}
    alone = httpx.post(f"{prefill.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    pulled = metric(decode.url, "argosy_kv_transfer_blocks_total", direction="pulled")
    with running_router(tmp_path / "router.log", *args) as router:
        url = f"{router.url}/v1/completions"
        if stream:
            pieces = []
            with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as answer:
                assert answer.status_code == 200
                for line in answer.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        pieces += [choice["text"] for choice in json.loads(line[6:])["choices"]]
            text = "".join(pieces)
        else:
            answer = httpx.post(url, json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            text = answer.json()["choices"][0]["text"]
        if policy == "kv_aware":
            assert f"kv_index {prefill.url}: spawned subscriber" in router.log()
    assert text == alone
    assert metric(decode.url, "argosy_kv_transfer_blocks_total", direction="pulled") >= pulled + 10
