"""KEDA's loop and Prometheus' answers as the simulator gives them, on the operator's own queries."""

from __future__ import annotations

import pytest
import simpy

from argosy.operator.owner import Owner
from argosy.operator.scaledobject import build_scaled_object, held_requests_query, pods_query, waiting_requests_query
from argosy.server.interface import GENERATION_TOKENS_METRIC, KV_USAGE_METRIC
from argosy.simulator.keda import ScaledObjectController
from argosy.simulator.prometheus import Prometheus
from tests.simulator.conftest import service

OWNER = Owner(name="svc", namespace="ns", uid="u")


class Pod:
    def __init__(self, state, waiting, running, kv, generated=0):
        self.state, self.generated = state, generated
        self.scraped = state in ("ready", "draining")
        self._gauges = {"waiting": waiting, "running": running, "kv_usage": kv}

    def gauges(self):
        return self._gauges


class Pods:
    def __init__(self, pods):
        self.pods, self.ended = pods, []


def scraped(pods, held=0):
    env = simpy.Environment()
    prometheus = Prometheus(env, Pods(pods), lambda: held, 15)
    env.run(until=1)
    return prometheus


def test_the_operators_queries_sum_the_ready_and_draining_pods():
    prometheus = scraped([Pod("ready", 3, 5, 0.5), Pod("draining", 2, 1, 0.25), Pod("starting", 9, 9, 0.9)])
    assert prometheus.query(waiting_requests_query(OWNER)) == 5
    assert prometheus.query(pods_query(OWNER, KV_USAGE_METRIC)) == 0.75
    assert scraped([]).query(waiting_requests_query(OWNER)) == 0  # `or vector(0)`
    assert scraped([], held=4).query(held_requests_query(OWNER)) == 4


def test_a_rate_is_the_counters_increase_over_the_range():
    env = simpy.Environment()
    pod = Pod("ready", 0, 0, 0)
    prometheus = Prometheus(env, Pods([pod]), lambda: 0, 15)

    def count():
        while True:
            pod.generated += 150  # 10 tokens a second
            yield env.timeout(15)

    env.process(count())
    env.run(until=301)
    assert prometheus.query(pods_query(OWNER, GENERATION_TOKENS_METRIC, rate="1m")) == pytest.approx(10)


def test_an_unknown_query_is_refused():
    with pytest.raises(ValueError, match="cannot evaluate"):
        scraped([]).query("histogram_quantile(0.9, x)")


def test_keda_activates_from_zero_and_cools_down_to_it():
    spec = service(minReplicas=0, maxReplicas=3, scaleDownStabilizationSeconds=120)
    spec = spec.model_copy(update={"routing": _picker()})
    keda = ScaledObjectController(build_scaled_object(OWNER, spec))
    assert keda.cooldown_seconds == 120 and keda.hpa.min_replicas == 1
    values = {"held": 1.0}

    def read(query):
        return values["held"] if "flow_control" in query else 0.0

    assert keda.poll(0, 0, read) == 1  # a held request wakes it
    values["held"] = 0.0
    assert keda.poll(60, 1, read) == 1  # inactive, within the cooldown
    assert keda.poll(121, 1, read) == 0


def test_keda_hands_its_hpa_the_scaled_objects_behavior_and_thresholds():
    keda = ScaledObjectController(
        build_scaled_object(OWNER, service(minReplicas=2, maxReplicas=9, targetWaitingRequests=4))
    )
    assert [(t.name, t.threshold) for t in keda.triggers] == [("waiting-requests", 4.0)]
    assert keda.hpa.behavior.scale_down.policies[0].value == 1  # the operator's one pod a minute
    assert keda.sync_hpa(0, 2, lambda q: 40.0) == 6  # scale-up: max(100%, 4 pods) of 2
    assert keda.poll(0, 2, lambda q: 0.0) == 2  # never to zero above minReplicaCount 0


def _picker():
    from argosy.operator.spec import RoutingSpec

    return RoutingSpec.model_validate({"endpointPicker": {"name": "picker"}})
