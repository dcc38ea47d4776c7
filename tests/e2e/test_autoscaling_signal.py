"""The autoscaling signal end to end, with real parts: a real `argosy serve`, a real
Prometheus scraping it with the labels a Kubernetes pod scrape attaches, and the exact query
the operator writes into the ScaledObject. A burst of requests must show up as waiting
requests (so the HPA would add replicas) and drain back to zero (so it would remove them)."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from argosy.operator.owner import Owner
from argosy.operator.scaledobject import build_scaled_object, pods_query
from argosy.operator.spec import InferenceServiceSpec
from argosy.server.interface import RUNNING_METRIC
from tests.polling import wait_until
from tests.processes import MODEL, serve_process
from tests.prometheus import prometheus_scraping, query

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "inferenceservice-autoscaled.yaml").read_text())
NAMESPACE, NAME = EXAMPLE["metadata"]["namespace"], EXAMPLE["metadata"]["name"]
POD = f"{NAME}-7d9f8b6c5d-x2k4p"
OTHER_POD = f"{NAME}-canary-5c7f9d8b4-q8z1m"  # another service's pod: the query must not count it


@pytest.fixture
def server(llama_checkpoint):
    with serve_process(llama_checkpoint, "--max-num-seqs", "1") as proc:
        yield proc.url


@pytest.fixture
def prometheus(server, tmp_path):
    with prometheus_scraping(tmp_path, [(server, NAMESPACE, POD), (server, NAMESPACE, OTHER_POD)]) as url:
        yield url


def hpa_replicas(value: float, target: float, lo: int, hi: int) -> int:
    """What the HPA does with an AverageValue external metric: ceil(value / target), bounded."""
    return max(lo, min(hi, math.ceil(value / target)))


def test_queue_depth_reaches_prometheus_and_drives_the_replica_count(server, prometheus):
    spec = InferenceServiceSpec.model_validate(EXAMPLE["spec"])
    trigger = build_scaled_object(Owner(name=NAME, namespace=NAMESPACE, uid="u"), spec)["spec"]
    promql = trigger["triggers"][0]["metadata"]["query"]
    threshold = float(trigger["triggers"][0]["metadata"]["threshold"])
    lo, hi = trigger["minReplicaCount"], trigger["maxReplicaCount"]
    # The query answers 0 even before any scrape (`or vector(0)`): wait for real samples of both pods.
    wait_until(
        lambda: query(prometheus, f'count(argosy_num_requests_waiting{{namespace="{NAMESPACE}"}})') == 2,
        30,
        "the first scrapes",
    )

    body = {"model": MODEL, "prompt": "a burst", "max_tokens": 300, "ignore_eos": True}
    threads = [
        threading.Thread(target=lambda: httpx.post(f"{server}/v1/completions", json=body, timeout=300))
        for _ in range(16)
    ]
    for t in threads:
        t.start()
    samples: list[tuple[float, float, int]] = []
    running: list[float] = []  # the query that keeps a service scaled from zero awake
    running_promql = pods_query(Owner(name=NAME, namespace=NAMESPACE, uid="u"), RUNNING_METRIC)
    start = time.monotonic()
    while any(t.is_alive() for t in threads):
        value = query(prometheus, promql)
        samples.append((time.monotonic() - start, value, hpa_replicas(value, threshold, lo, hi)))
        running.append(query(prometheus, running_promql))
        time.sleep(0.5)
    for t in threads:
        t.join()
    wait_until(lambda: query(prometheus, promql) == 0.0, 30, "the queue to drain in Prometheus")
    drained = query(prometheus, promql)
    samples.append((time.monotonic() - start, drained, hpa_replicas(drained, threshold, lo, hi)))

    print(f"\nquery: {promql}\nthreshold {threshold}, replicas {lo}..{hi}")
    print("| t (s) | waiting (Prometheus) | HPA replicas |\n|--:|--:|--:|")
    for t, value, replicas in samples[:: max(1, len(samples) // 12)] + samples[-1:]:
        print(f"| {t:.1f} | {value:.0f} | {replicas} |")
    peak = max(v for _, v, _ in samples)
    # A request counts as waiting from the moment it is accepted, so all sixteen can wait for
    # the instant before the core schedules the first; the canary pod would double that.
    assert 0 < peak <= 16
    assert max(r for _, _, r in samples) >= 2 and samples[-1][2] == lo
    assert max(running) == 1  # --max-num-seqs 1; the canary pod would make it 2
    # The other target is scraped at its own phase, up to a scrape interval later: wait for it too.
    wait_until(
        lambda: query(prometheus, f'sum(argosy_num_requests_waiting{{namespace="{NAMESPACE}"}})') == 0.0,
        10,
        "the other scrape to drain too",
    )
