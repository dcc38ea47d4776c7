"""InferenceService -> the InferencePool that puts its pods behind an Endpoint Picker, and the
HTTPRoute that sends a Gateway's traffic for the model to that pool.

The pool selects exactly the pods the Service selects, on the server's port; the picker (llm-d's
router, installed with its own chart) reads their `vllm:*` metrics and picks a pod for each
request. The route is optional: without it the pool is there for a route of the user's own."""

from __future__ import annotations

from typing import Any

from argosy.operator.kinds import GATEWAY, HTTP_ROUTE, INFERENCE_POOL, SERVICE
from argosy.operator.labels import manifest, serving_labels
from argosy.operator.owner import Owner
from argosy.operator.spec import EndpointPickerSpec, InferenceServiceSpec, RouteSpec
from argosy.server.interface import SERVER_PORT

# Set by the Inference Extension's body-based router from the request body's `model` field.
MODEL_HEADER = "X-Gateway-Model-Name"


def build_inference_pool(owner: Owner, picker: EndpointPickerSpec, leaders_only: bool = False) -> dict[str, Any]:
    """`leaders_only`: the pods are LeaderWorkerSet groups, whose leaders alone serve the API."""
    return manifest(
        INFERENCE_POOL,
        owner,
        {
            "selector": {"matchLabels": serving_labels(owner, leaders_only)},
            "targetPorts": [{"number": SERVER_PORT}],
            "endpointPickerRef": {
                "kind": SERVICE.kind,
                "name": picker.name,
                "port": {"number": picker.port},
                "failureMode": picker.failureMode,
            },
        },
    )


def build_http_route(owner: Owner, spec: InferenceServiceSpec, route: RouteSpec) -> dict[str, Any]:
    gateway = route.gateway
    parent = {"group": GATEWAY.group, "kind": GATEWAY.kind, "name": gateway.name}
    if gateway.namespace:
        parent["namespace"] = gateway.namespace
    if gateway.sectionName:
        parent["sectionName"] = gateway.sectionName
    match: dict[str, Any] = {"path": {"type": "PathPrefix", "value": route.pathPrefix}}
    if route.matchModelHeader:
        match["headers"] = [{"type": "Exact", "name": MODEL_HEADER, "value": spec.model.name}]
    rule: dict[str, Any] = {
        "matches": [match],
        "backendRefs": [{"group": INFERENCE_POOL.group, "kind": INFERENCE_POOL.kind, "name": owner.name}],
        # Gateways' own defaults (Envoy's is 15 s) would cut long generations short; "0s" is none.
        "timeouts": {"request": f"{route.requestTimeoutSeconds}s"},
    }
    route_spec: dict[str, Any] = {"parentRefs": [parent], "rules": [rule]}
    if route.hostnames:
        route_spec["hostnames"] = list(route.hostnames)
    return manifest(HTTP_ROUTE, owner, route_spec)
