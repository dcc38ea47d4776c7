"""A stored response's KV blocks stay ahead of other requests' in the eviction order: after other
traffic has churned through a small cache, the conversation's next turn still finds its first
turn's blocks (its cached tokens), where without the pin (--responses-kv-pin 0) they are gone."""

from __future__ import annotations

import pytest

from tests.processes import MODEL
from tests.server.api.servers import metric, run_server

WORDS = ["amber", "basil", "cedar", "delta", "ember", "fable", "garnet", "harbor", "indigo", "juniper", "kelp", "lumen"]
FIRST_TURN = " ".join(WORDS[i % len(WORDS)] + str(i) for i in range(20))
BLOCKS = 64  # of 16 tokens: a first turn takes a sixth of them, the churn (8 prompts of 12) more than all


def churn(client) -> None:
    for i in range(8):
        prompt = " ".join(f"{WORDS[(i + j) % len(WORDS)]}{1000 + 100 * i + j}" for j in range(20))
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=2)


def continued_turn(pin_s: float, llama_checkpoint) -> tuple[int, int, float]:
    """(the first turn's input tokens, the second's cached tokens, pinned blocks after the churn)."""
    kv_bytes = BLOCKS * 16 * 2 * 2 * 2 * 16 * 4  # blocks x tokens x layers x (K, V) x kv heads x head_dim x float32
    with run_server(llama_checkpoint, kv_cache_memory=kv_bytes, responses_kv_pin=pin_s) as server:
        client = server.client()
        first = client.responses.create(model=MODEL, input=FIRST_TURN, max_output_tokens=4, temperature=0)
        churn(client)
        pinned = metric(server.url, "argosy_kv_cache_pinned_blocks")
        second = client.responses.create(
            model=MODEL, input="and then?", previous_response_id=first.id, max_output_tokens=2, temperature=0
        )
        return first.usage.input_tokens, second.usage.input_tokens_details.cached_tokens, pinned


@pytest.mark.parametrize("pin_s", [300.0, 0.0], ids=["pinned", "unpinned"])
def test_the_next_turn_finds_the_first_turns_blocks_only_when_pinned(llama_checkpoint, pin_s):
    first_tokens, cached, pinned = continued_turn(pin_s, llama_checkpoint)
    assert first_tokens > 0.15 * BLOCKS * 16  # the first turn is a good share of the cache
    if pin_s:
        assert cached >= first_tokens - 16 and pinned > 0  # all its full blocks
    else:
        assert cached < 16 and pinned == 0  # churned out
