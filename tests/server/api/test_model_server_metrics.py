"""/metrics speaks the model-server protocol that gateways' endpoint pickers read: every
Argosy series also under vLLM's name, equal to its twin, and each checked against the
engine's own counts after real requests; responses report their prefix-cache hits as
usage.prompt_tokens_details.cached_tokens."""

from __future__ import annotations

from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

from argosy.server.api.metrics import VLLM_NAMES
from tests.processes import MODEL
from tests.server.api.servers import paused_core

PROTOCOL = {  # the series the issue and the Inference Extension's protocol name
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:request_queue_time_seconds_count",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
}


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """name -> {sorted labels: value}, for every sample of /metrics."""
    samples: dict[str, dict[tuple, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            samples[s.name][tuple(sorted(s.labels.items()))] = s.value
    return samples


def one(samples, name: str, **labels) -> float:
    return samples[name][tuple(sorted({"model_name": MODEL, **labels}.items()))]


def test_every_series_under_vllm_names_matches_the_engine(server):
    prompt = "the fleet sails at dawn, " * 12  # several blocks long: the second call reuses them
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 6, "ignore_eos": True}
    usages = [httpx.post(f"{server.url}/v1/completions", json=body).json()["usage"] for _ in range(2)]
    samples = scrape(server.url)
    stats = server.engine.stats()

    assert set(samples) >= PROTOCOL
    for argosy_name, vllm_name in VLLM_NAMES.items():  # twins, sample by sample (buckets included)
        ours_base, theirs_base = argosy_name.removesuffix("_total"), vllm_name.removesuffix("_total")

        def series(base: str, rename: str) -> dict:
            # _created holds each series' own creation time: the one sample twins do not share.
            return {n.replace(base, rename, 1): v for n, v in samples.items() if n.startswith(base + "_") or n == base}

        ours, theirs = series(ours_base, theirs_base), series(theirs_base, theirs_base)
        assert {n: v for n, v in ours.items() if not n.endswith("_created")} == {
            n: v for n, v in theirs.items() if not n.endswith("_created")
        }, vllm_name
        assert theirs, vllm_name

    generated = sum(u["completion_tokens"] for u in usages)
    assert one(samples, "vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert one(samples, "vllm:generation_tokens_total") == generated == 12
    assert one(samples, "vllm:request_success_total", finished_reason="length") == 2
    assert one(samples, "vllm:time_to_first_token_seconds_count") == 2
    assert one(samples, "vllm:e2e_request_latency_seconds_count") == 2
    assert one(samples, "vllm:request_queue_time_seconds_count") == 2
    assert one(samples, "vllm:inter_token_latency_seconds_count") == generated - 2
    assert one(samples, "vllm:prefix_cache_queries_total") == stats.prefix_cache_queries
    assert one(samples, "vllm:prefix_cache_hits_total") == stats.prefix_cache_hits
    assert one(samples, "vllm:num_requests_waiting") == 0 and one(samples, "vllm:num_requests_running") == 0
    assert one(samples, "vllm:kv_cache_usage_perc") == stats.kv_cache_usage

    # The second call found the first one's prompt blocks; usage says how many tokens.
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    block = server.state.config.engine.block_size
    assert cached[0] == 0 and cached[1] > 0 and cached[1] % block == 0
    assert sum(cached) == stats.prefix_cache_hits

    (labels,) = samples["vllm:cache_config_info"]
    info = dict(labels)
    assert info["block_size"] == str(block) and info["num_gpu_blocks"] == str(stats.kv_blocks_total)
    assert samples["vllm:cache_config_info"][labels] == 1


def test_the_queue_gauges_follow_a_running_request(server):
    body = {"model": MODEL, "prompt": "long story", "max_tokens": 400, "stream": True, "ignore_eos": True}
    client = httpx.Client(base_url=server.url, timeout=60)
    with client, client.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        with paused_core(server):
            samples = scrape(server.url)
            assert one(samples, "vllm:num_requests_running") == 1
            assert one(samples, "vllm:kv_cache_usage_perc") == server.engine.stats().kv_cache_usage > 0
