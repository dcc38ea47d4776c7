"""Latency objectives -> KEDA thresholds: the queueing model against hand-worked figures (the
Erlang percentiles from published chi-square tables), the ScaledObject it makes against KEDA's
CRD, and the operator reading the profile's ConfigMap in the API emulator."""

from __future__ import annotations

import json

import pytest

from argosy.operator.labels import MANAGED_BY_LABEL, PROFILE_MANAGED_BY
from argosy.operator.objectives import (
    ObjectivesUnreachable,
    Workload,
    derive_thresholds,
    thresholds_for,
    thresholds_from_config_map,
)
from argosy.operator.owner import Owner
from argosy.operator.scaledobject import build_scaled_object
from argosy.operator.spec import InferenceServiceSpec, ObjectivesSpec
from tests.operator.cluster import AIS, NS, SCALED_OBJECTS, eventually, inference_service, live, path, running_operator
from tests.operator.crd_schema import add_on_rejections
from tests.prometheus import check_rules
from tests.simulator.conftest import COEFFICIENTS, fit_free_profile

OBJECTIVES = {"timeToFirstTokenSeconds": 2, "interTokenLatencySeconds": 0.05, "promptTokens": 400, "outputTokens": 100}


@pytest.fixture
def profile(tmp_path):
    return fit_free_profile(str(tmp_path / "absent"), COEFFICIENTS)


def test_the_batch_is_the_largest_within_the_itl_objective(profile):
    # t(B) = 10 ms + B x (1 ms decode + 400/100 prompt tokens x 0.5 ms) = 10 + 3B ms; 50 ms allows B = 13.
    t = derive_thresholds(profile, 2.0, 0.05, 99, Workload(400, 100))
    assert t.running_requests == 13
    assert t.step_seconds == pytest.approx(0.049)
    assert t.tokens_per_second == pytest.approx(13 / 0.049)
    assert t.kv_cache_usage == pytest.approx(13 * 450 / (2048 * 16))


def test_the_queue_is_the_longest_whose_wait_percentile_fits(profile):
    # Departures: 13 / (0.049 s x 100 tokens) = 2.653/s; the prompt alone takes 10 + 200 ms.
    # The p99 of an Erlang(k) wait is chi2(0.99, 2k) / 2 / rate: k=1 4.605, k=2 6.638, k=5 11.605, k=6 13.108.
    # Beside those, the 1024 // 400 = 2 prompts one step admits.
    rate = 13 / (0.049 * 100)
    assert 4.605 / rate <= 2.0 - 0.21 < 6.638 / rate
    assert derive_thresholds(profile, 2.0, 0.05, 99, Workload(400, 100)).waiting_requests == 1 + 2
    assert 11.605 / rate <= 5.0 - 0.21 < 13.108 / rate
    assert derive_thresholds(profile, 5.0, 0.05, 99, Workload(400, 100)).waiting_requests == 5 + 2
    assert derive_thresholds(profile, 5.0, 0.05, 50, Workload(400, 100)).waiting_requests > 5


def test_objectives_no_replica_can_meet_are_refused_by_name(profile):
    with pytest.raises(ObjectivesUnreachable, match="inter-token latency objective"):
        derive_thresholds(profile, 2.0, 0.012, 99, Workload(400, 100))
    with pytest.raises(ObjectivesUnreachable, match="time-to-first-token objective"):
        derive_thresholds(profile, 0.1, 0.05, 99, Workload(400, 100))


def test_the_profile_comes_from_its_config_map(profile):
    objectives = ObjectivesSpec.model_validate({**OBJECTIVES, "profileConfigMap": "gpu-profile"})
    for config_map, why in [
        (None, "ConfigMap gpu-profile does not exist"),
        ({"data": {}}, "has no key profile.json"),
        ({"data": {"profile.json": "{}"}}, "is no engine profile"),
    ]:
        with pytest.raises(ValueError, match=why) as failure:
            thresholds_from_config_map(config_map, objectives)
        assert "spec.autoscaling.objectives.profileConfigMap" in str(failure.value)
    found = thresholds_from_config_map({"data": {"profile.json": profile.model_dump_json()}}, objectives)
    assert found.running_requests == 13


def scaled(spec_autoscaling: dict, thresholds):
    spec = InferenceServiceSpec.model_validate(
        {
            **inference_service()["spec"],
            "autoscaling": {"maxReplicas": 8, "prometheusAddress": "http://p:9090", **spec_autoscaling},
        }
    )
    return build_scaled_object(Owner(name="llama", namespace=NS, uid="u"), spec, thresholds)


def test_the_scaled_object_scales_on_the_derived_thresholds(profile, tmp_path):
    thresholds = derive_thresholds(profile, 5.0, 0.05, 99, Workload(400, 100))
    obj = scaled({"objectives": {**OBJECTIVES, "profileConfigMap": "p"}}, thresholds)
    assert add_on_rejections(obj) == []
    triggers = {t["name"]: t["metadata"] for t in obj["spec"]["triggers"]}
    assert set(triggers) == {"waiting-requests", "output-tokens", "kv-cache-usage"}
    assert triggers["waiting-requests"]["threshold"] == "7"
    assert float(triggers["output-tokens"]["threshold"]) == pytest.approx(thresholds.tokens_per_second, rel=1e-3)
    assert "rate(argosy_generation_tokens_total{" in triggers["output-tokens"]["query"]
    assert "[1m])" in triggers["output-tokens"]["query"]
    # A threshold the user sets wins.
    queries = [t["metadata"]["query"] for t in obj["spec"]["triggers"]]
    checked = check_rules(tmp_path, "objectives", queries)  # Prometheus' own parser reads them
    assert checked.returncode == 0, checked.stdout + checked.stderr
    mine = scaled({"targetWaitingRequests": 3, "objectives": {**OBJECTIVES, "profileConfigMap": "p"}}, thresholds)
    assert {t["name"]: t["metadata"]["threshold"] for t in mine["spec"]["triggers"]}["waiting-requests"] == "3"


async def test_the_operator_derives_the_thresholds_and_says_them(cluster, profile):
    objectives = {**OBJECTIVES, "profileConfigMap": "gpu-profile"}
    body = inference_service(
        autoscaling={"maxReplicas": 4, "prometheusAddress": "http://p:9090", "objectives": objectives}
    )
    async with running_operator():
        response = await cluster.post(path(AIS), json=body)
        assert response.status == 200, await response.text()
        status = await eventually(lambda: (live(cluster, AIS, "llama") or {}).get("status"))
        stalled = await eventually(lambda: _condition(cluster, "Stalled", "True"))
        assert "ConfigMap gpu-profile does not exist" in stalled["message"]
        # The profile's ConfigMap, labelled as its docs say: its creation alone reconciles the service.
        config_map = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "gpu-profile", "namespace": NS, "labels": {MANAGED_BY_LABEL: PROFILE_MANAGED_BY}},
            "data": {"profile.json": profile.model_dump_json()},
        }
        response = await cluster.post(f"/api/v1/namespaces/{NS}/configmaps", json=config_map)
        assert response.status in (200, 201), await response.text()
        status = await eventually(lambda: (live(cluster, AIS, "llama") or {}).get("status", {}).get("autoscaling"))
        assert status["runningRequests"] == 13 and status["waitingRequests"] == 3
        triggers = live(cluster, SCALED_OBJECTS, "llama")["spec"]["triggers"]
        assert {t["name"] for t in triggers} == {"waiting-requests", "output-tokens", "kv-cache-usage"}
        assert json.loads(json.dumps(triggers))  # plain data
        # A slower engine profiled again: the service's thresholds follow the new profile.
        slower = fit_free_profile("absent", {**COEFFICIENTS, "decode_seqs": 2 * COEFFICIENTS["decode_seqs"]})
        await cluster.patch(
            f"/api/v1/namespaces/{NS}/configmaps/gpu-profile",
            json={"data": {"profile.json": slower.model_dump_json()}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        expected = thresholds_for(slower, ObjectivesSpec.model_validate(objectives)).as_status()
        assert expected["runningRequests"] < 13
        await eventually(lambda: live(cluster, AIS, "llama")["status"]["autoscaling"] == expected)


def _condition(cluster, kind: str, value: str):
    conditions = ((live(cluster, AIS, "llama") or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind and c["status"] == value), None)
