"""Speculative decoding behind the OpenAI API: `--speculative-config` as vLLM takes it, the
real `openai` client's answers unchanged by it, and vLLM's spec_decode counters on /metrics."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.polling import wait_until
from tests.processes import MODEL
from tests.server.api.servers import run_server

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4})
PROMPT = (
    "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, "
    "mango, nectarine. Again: apple, banana,"
)
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def test_answers_are_unchanged_and_vllms_counters_count_the_drafts():
    texts = {}
    for config in (None, NGRAM):
        with run_server(None, speculative_config=config, max_model_len=256, kv_cache_memory=32 << 20) as srv:
            reply = srv.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0)
            texts[config] = reply.choices[0].text
            if config is None:
                assert srv.metric("vllm:spec_decode_num_drafts_total") == 0
                continue
            wait_until(lambda: srv.metric("vllm:spec_decode_num_drafts_total") > 0, 10, "the counters to arrive")
            stats = srv.engine.stats().spec_decode
            for name in COUNTERS:
                value = getattr(stats, name)
                assert srv.metric(f"vllm:spec_decode_{name}_total") == srv.metric(f"argosy_spec_decode_{name}_total")
                assert srv.metric(f"vllm:spec_decode_{name}_total") == value > 0
            by_position = [
                srv.metric("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p)) for p in range(4)
            ]
            assert by_position == stats.accepted_per_pos and sum(by_position) == stats.num_accepted_tokens
    assert texts[NGRAM] == texts[None]


def test_a_bad_speculative_config_stops_argosy_serve_naming_the_field():
    bad = json.dumps({"method": "ngram", "num_speculative_tokens": 0})
    done = subprocess.run(
        [sys.executable, "-P", "-m", "argosy.cli", "serve", "--speculative-config", bad],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "speculative_config.num_speculative_tokens" in done.stderr
