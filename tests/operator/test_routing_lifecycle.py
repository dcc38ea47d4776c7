"""Routing against the API emulator, kopf running in-process: the pool and the route appear,
follow the spec, are put back when edited, go when the spec drops them, and the status waits
for the Gateway's acceptance; missing CRDs are reported and recovered from."""

from __future__ import annotations

from tests.operator.cluster import (
    AIS,
    HTTP_ROUTES,
    INFERENCE_POOLS,
    SCALED_OBJECTS,
    declare_resources,
    eventually,
    inference_service,
    live,
    mark_deployment_ready,
    patch,
    ready_condition,
    running_operator,
)
from tests.operator.test_lifecycle import create, event_reasons

ROUTING = {"endpointPicker": {"name": "llama-epp"}, "route": {"gateway": {"name": "gw", "namespace": "gateways"}}}
FROM_ZERO = {"minReplicas": 0, "maxReplicas": 4, "prometheusAddress": "http://prometheus.monitoring:9090"}


def gateway_status(obj: dict, accepted: str, reason: str) -> dict:
    """What the Gateway's controller writes: its view of the object's current generation."""
    condition = {
        "type": "Accepted",
        "status": accepted,
        "reason": reason,
        "message": f"the gateway says {reason}",
        "observedGeneration": obj["metadata"]["generation"],
        "lastTransitionTime": "2026-12-01T00:00:00Z",
    }
    parent = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw", "namespace": "gateways"}
    entry = {"parentRef": parent, "controllerName": "example.com/gateway-controller", "conditions": [condition]}
    return {"status": {"parents": [entry]}}


def reason(cluster) -> str:
    return ready_condition(live(cluster, AIS, "llama"))["reason"]


async def test_routing_is_reconciled_and_ready_waits_for_the_gateway(cluster):
    async with running_operator():
        await create(cluster, inference_service(routing=ROUTING, autoscaling=FROM_ZERO))
        pool = await eventually(lambda: live(cluster, INFERENCE_POOLS, "llama"))
        route = await eventually(lambda: live(cluster, HTTP_ROUTES, "llama"))
        ais = live(cluster, AIS, "llama")
        for obj in (pool, route):
            assert obj["metadata"]["ownerReferences"][0]["uid"] == ais["metadata"]["uid"]
        assert pool["spec"]["endpointPickerRef"]["name"] == "llama-epp"
        assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == "llama"
        scaled = await eventually(lambda: live(cluster, SCALED_OBJECTS, "llama"))
        assert scaled["spec"]["minReplicaCount"] == 0 and len(scaled["spec"]["triggers"]) == 3

        await mark_deployment_ready(cluster, "llama", ready=1)
        await eventually(lambda: reason(cluster) == "RoutePending")
        await patch(cluster, HTTP_ROUTES, "llama", gateway_status(route, "True", "Accepted"), subresource="status")
        await eventually(lambda: reason(cluster) == "PoolPending")
        await patch(cluster, INFERENCE_POOLS, "llama", gateway_status(pool, "True", "Accepted"), subresource="status")
        await eventually(lambda: reason(cluster) == "Available")

        rejected = gateway_status(route, "False", "NotAllowedByListeners")
        await patch(cluster, HTTP_ROUTES, "llama", rejected, subresource="status")
        await eventually(lambda: reason(cluster) == "RouteNotAccepted")
        stalled = next(c for c in live(cluster, AIS, "llama")["status"]["conditions"] if c["type"] == "Stalled")
        assert stalled["status"] == "True" and "NotAllowedByListeners" in stalled["message"]
        await eventually(lambda: "RouteNotAccepted" in event_reasons(cluster, "Warning"))


async def test_dropping_the_route_then_the_routing_removes_them_in_turn(cluster):
    async with running_operator():
        await create(cluster, inference_service(routing=ROUTING))
        await eventually(lambda: live(cluster, HTTP_ROUTES, "llama"))
        await patch(cluster, AIS, "llama", {"spec": {"routing": {"route": None}}})
        await eventually(lambda: live(cluster, HTTP_ROUTES, "llama") is None)
        assert live(cluster, INFERENCE_POOLS, "llama") is not None
        await patch(cluster, AIS, "llama", {"spec": {"routing": None}})
        await eventually(lambda: live(cluster, INFERENCE_POOLS, "llama") is None)


async def test_missing_inference_extension_and_gateway_api_are_reported_and_recovered(cluster):
    cluster.resources.clear()
    declare_resources(cluster)
    async with running_operator():
        await create(cluster, inference_service(routing=ROUTING))
        await eventually(lambda: reason(cluster) == "InferencePoolNotInstalled")
        message = ready_condition(live(cluster, AIS, "llama"))["message"]
        assert "inference.networking.k8s.io/v1" in message and "Inference Extension" in message
        declare_resources(cluster, "inference-extension")
        await eventually(lambda: live(cluster, INFERENCE_POOLS, "llama"), timeout=30)
        await eventually(lambda: reason(cluster) == "GatewayAPINotInstalled")
        declare_resources(cluster, "inference-extension", "gateway-api")
        await eventually(lambda: live(cluster, HTTP_ROUTES, "llama"), timeout=60)
        await eventually(lambda: reason(cluster) == "Progressing")


async def test_the_pool_and_route_follow_the_spec_and_edits_are_put_back(cluster):
    async with running_operator():
        await create(cluster, inference_service(routing=ROUTING))
        await eventually(lambda: live(cluster, HTTP_ROUTES, "llama"))
        picker = {"endpointPicker": {"name": "other-epp", "port": 9102}}
        await patch(cluster, AIS, "llama", {"spec": {"routing": picker}})
        await eventually(
            lambda: (
                live(cluster, INFERENCE_POOLS, "llama")["spec"]["endpointPickerRef"]
                == {"kind": "Service", "name": "other-epp", "port": {"number": 9102}, "failureMode": "FailClose"}
            )
        )
        await patch(cluster, HTTP_ROUTES, "llama", {"spec": {"parentRefs": [{"name": "someone-elses"}]}})
        await eventually(lambda: live(cluster, HTTP_ROUTES, "llama")["spec"]["parentRefs"][0]["name"] == "gw")
        await patch(cluster, INFERENCE_POOLS, "llama", {"spec": {"selector": {"matchLabels": {"app": "x"}}}})
        await eventually(
            lambda: (
                live(cluster, INFERENCE_POOLS, "llama")["spec"]["selector"]["matchLabels"]
                == {"app.kubernetes.io/name": "argosy", "app.kubernetes.io/instance": "llama"}
            )
        )
