"""The scale-from-zero signal with a real Prometheus and the exact query the operator writes
into the ScaledObject's second trigger.

The Endpoint Picker is a Go program this machine cannot run, so the test plays its part: it
exports, with the real Prometheus client, the gauges llm-d's router registers for its
flow-control queue, under the names and labels of its source (pkg/epp/metrics:
`llm_d_epp_flow_control_queue_size` and the deprecated `inference_extension_flow_control_queue_size`,
labelled fairness_id, priority, inference_pool, model_name, target_model_name). Two pickers are
scraped, as pods of two namespaces that each hold a pool of the same name."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import prometheus_client
import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge

from argosy.operator.owner import Owner
from argosy.operator.scaledobject import HELD_METRICS, build_scaled_object
from argosy.operator.spec import InferenceServiceSpec
from tests.polling import wait_until
from tests.processes import free_port
from tests.prometheus import prometheus_scraping, query

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "inferenceservice-routed.yaml").read_text())
NAMESPACE, NAME = EXAMPLE["metadata"]["namespace"], EXAMPLE["metadata"]["name"]
LABELS = ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name")
MODEL = EXAMPLE["spec"]["model"]["name"]


class Picker:
    """One Endpoint Picker's flow-control gauges, served on loopback."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.gauges = {name: Gauge(name, "requests held", LABELS, registry=self.registry) for name in HELD_METRICS}
        self.port = free_port()
        self.server, self.thread = prometheus_client.start_http_server(self.port, "127.0.0.1", self.registry)
        self.url = f"http://127.0.0.1:{self.port}"

    def hold(self, pool: str, fairness: str, count: int, names=HELD_METRICS) -> None:
        """Exports `count` held requests under each of `names`, and none under the others."""
        for name in HELD_METRICS:
            labels = (fairness, "0", pool, MODEL, MODEL)
            if name in names:
                self.gauges[name].labels(*labels).set(count)
            else:
                with contextlib.suppress(KeyError):  # not exported under that name
                    self.gauges[name].remove(*labels)

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def pickers(tmp_path):
    ours, theirs = Picker(), Picker()
    targets = [(ours.url, NAMESPACE, f"{NAME}-epp-6f7d8c9b5-k2m4q"), (theirs.url, "other", "epp-5d6c7b8a9-z9y8x")]
    try:
        with prometheus_scraping(tmp_path, targets) as prometheus:
            yield ours, theirs, prometheus
    finally:
        ours.close()
        theirs.close()


def keda_replicas(values: list[float], triggers: list[dict], current: int, lo: int, hi: int) -> int:
    """What KEDA and its HPA make of the triggers' values: at zero, any value above its
    activation threshold starts one pod; from there the HPA takes the largest
    ceil(value / threshold) (AverageValue), bounded."""
    if current == 0:
        active = any(v > float(t["metadata"]["activationThreshold"]) for v, t in zip(values, triggers))
        return 1 if active else 0
    wanted = max(math.ceil(v / float(t["metadata"]["threshold"])) for v, t in zip(values, triggers))
    return max(max(lo, 1), min(hi, wanted))


def test_one_held_request_wakes_the_service_and_only_its_own_pool_counts(pickers):
    ours, theirs, prometheus = pickers
    spec = InferenceServiceSpec.model_validate(EXAMPLE["spec"])
    scaled = build_scaled_object(Owner(name=NAME, namespace=NAMESPACE, uid="u"), spec)
    triggers = scaled["spec"]["triggers"]
    held = next(t for t in triggers if t["name"] == "held-requests")["metadata"]["query"]
    lo, hi = scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]
    assert lo == 0
    wait_until(lambda: query(prometheus, "count(up == 1)") == 2, 30, "the first scrapes of both pickers")

    def settles(expected: float, what: str) -> None:
        wait_until(lambda: query(prometheus, held) == expected, 15, what)

    settles(0.0, "no held request to read 0")  # an answer, not an empty result, at zero
    theirs.hold(NAME, "default", 7)  # the same pool name in another namespace
    ours.hold("another-pool", "default", 5)  # another pool of the same picker
    wait_until(lambda: query(prometheus, "sum(llm_d_epp_flow_control_queue_size)") == 12, 15, "the others' series")
    settles(0.0, "the other pools not to count")

    ours.hold(NAME, "default", 1)  # the router exports both names: the query must not double
    settles(1.0, "one held request")
    # No pod: the pods' queries (waiting, running) read 0; the held request alone wakes one.
    assert [t["name"] for t in triggers] == ["waiting-requests", "held-requests", "running-requests"]
    assert keda_replicas([0.0, 1.0, 0.0], triggers, current=0, lo=lo, hi=hi) == 1
    assert keda_replicas([0.0, 0.0, 0.0], triggers, current=0, lo=lo, hi=hi) == 0

    ours.hold(NAME, "team-a", 12)  # held requests of every fairness id add up
    settles(13.0, "thirteen held requests")
    assert keda_replicas([0.0, 13.0, 0.0], triggers, current=1, lo=lo, hi=hi) == 3

    ours.hold(NAME, "default", 0, names=())
    ours.hold(NAME, "team-a", 2, names=HELD_METRICS[1:])  # an older router: only the deprecated name
    settles(2.0, "the deprecated name to be read")

    ours.hold(NAME, "team-a", 0, names=HELD_METRICS[1:])
    settles(0.0, "the queue to drain")
