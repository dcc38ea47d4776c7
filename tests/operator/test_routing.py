"""Routing: the InferencePool and HTTPRoute the operator builds, the scale-from-zero trigger,
every generated PromQL query checked by promtool, and the status read from the Gateway's
conditions on the route and the pool."""

from __future__ import annotations

import pytest

from argosy.operator.deployment import build_deployment
from argosy.operator.reconcile import desired_objects, dropped_objects
from argosy.operator.routing_status import routing_problem
from argosy.operator.scaledobject import build_scaled_object, held_requests_query, waiting_requests_query
from argosy.operator.service import build_service
from argosy.operator.spec import InferenceServiceSpec
from argosy.operator.status import compute_status
from tests.operator.specs import SPECS
from tests.operator.test_builders import OWNER, spec_of
from tests.prometheus import check_rules


def objects_of(name: str) -> dict[str, dict]:
    return {kind.kind: obj for kind, obj in desired_objects(OWNER, spec_of(name))}


def test_the_pool_selects_exactly_the_services_pods_and_names_the_picker():
    objects = objects_of("routed-from-zero")
    pool = objects["InferencePool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"] == build_service(OWNER)["spec"]["selector"]
    deployment = build_deployment(OWNER, spec_of("routed-from-zero"))
    assert pool["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service",
        "name": "llama-epp",
        "port": {"number": 9102},
        "failureMode": "FailOpen",
    }
    assert pool["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    assert pool["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "argosy-operator"
    defaults = objects_of("pool-only")["InferencePool"]["spec"]["endpointPickerRef"]
    assert defaults["port"] == {"number": 9002} and defaults["failureMode"] == "FailClose"


def test_the_route_sends_the_gateways_traffic_for_the_model_to_the_pool():
    route = objects_of("routed-from-zero")["HTTPRoute"]
    assert route["spec"]["parentRefs"] == [
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": "inference-gateway",
            "namespace": "gateways",
            "sectionName": "https",
        }
    ]
    assert route["spec"]["hostnames"] == ["llm.example.com"]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "svc"}]
    assert rule["matches"] == [
        {
            "path": {"type": "PathPrefix", "value": "/v1"},
            "headers": [{"type": "Exact", "name": "X-Gateway-Model-Name", "value": "llama-3-8b-instruct"}],
        }
    ]
    assert rule["timeouts"] == {"request": "900s"}


def test_routing_objects_come_and_go_with_the_spec():
    assert set(objects_of("pool-only")) == {"Deployment", "Service", "PodDisruptionBudget", "InferencePool"}
    assert {"InferencePool", "HTTPRoute", "ScaledObject"} <= set(objects_of("routed-from-zero"))

    def dropped(name: str) -> list[str]:
        return [f"{k.kind} {n}" for k, n in dropped_objects(OWNER, desired_objects(OWNER, spec_of(name)))]

    router = ["Deployment svc-router", "Service svc-router", "RoleBinding svc-router", "Role svc-router",
              "ServiceAccount svc-router"]  # fmt: skip
    roles_scaled = ["ScaledObject svc-prefill", "ScaledObject svc-decode"]
    roles = ["Deployment svc-prefill", "Deployment svc-decode", "LeaderWorkerSet svc"]
    assert dropped("plain-gpu") == ["ScaledObject svc", *roles_scaled, "HTTPRoute svc", "InferencePool svc",
                                    "ConfigMap svc", *router, *roles]  # fmt: skip
    assert dropped("pool-only") == [
        "ScaledObject svc",
        *roles_scaled,
        "HTTPRoute svc",
        "ConfigMap svc",
        *router,
        *roles,
    ]
    assert dropped("routed-from-zero") == [*roles_scaled, "ConfigMap svc", *router, *roles]
    # Disaggregated: the roles replace the one Deployment (its scaled role keeps its ScaledObject).
    assert dropped("disaggregated") == ["ScaledObject svc", "ScaledObject svc-prefill", "HTTPRoute svc",
                                        "InferencePool svc", "ConfigMap svc", "Deployment svc",
                                        "LeaderWorkerSet svc"]  # fmt: skip
    # Across nodes: the LeaderWorkerSet replaces the Deployment.
    assert "Deployment svc" in dropped("across-nodes") and "LeaderWorkerSet svc" not in dropped("across-nodes")


def test_with_routing_the_picker_queue_wakes_the_service_from_zero():
    spec = spec_of("routed-from-zero")
    scaled = build_scaled_object(OWNER, spec)["spec"]
    assert scaled["minReplicaCount"] == 0 and scaled["cooldownPeriod"] == 600
    waiting, held, running = scaled["triggers"]
    assert [t["name"] for t in scaled["triggers"]] == ["waiting-requests", "held-requests", "running-requests"]
    assert waiting["metadata"]["query"] == waiting_requests_query(OWNER)
    # Busy within capacity (nothing waits, nothing is held), the service must stay awake.
    assert running["metadata"]["query"] == waiting_requests_query(OWNER).replace("waiting", "running")
    assert running["metadata"]["threshold"] == str(spec.engine.maxNumSeqs)  # a full batch per replica
    assert (waiting["metadata"]["threshold"], held["metadata"]["threshold"]) == ("5", "5")
    assert held["metadata"]["query"] == (
        'sum(llm_d_epp_flow_control_queue_size{namespace="llm",inference_pool="svc"})'
        ' or sum(inference_extension_flow_control_queue_size{namespace="llm",inference_pool="svc"})'
        " or vector(0)"
    )
    for trigger in (waiting, held, running):  # one request, wherever it is, keeps (or brings) one pod
        assert trigger["metadata"]["activationThreshold"] == "0" and trigger["metricType"] == "AverageValue"
    plain = build_scaled_object(OWNER, spec_of("autoscaled"))["spec"]
    assert [t["name"] for t in plain["triggers"]] == ["waiting-requests"] and "cooldownPeriod" not in plain
    routed = spec.model_copy(update={"autoscaling": spec.autoscaling.model_copy(update={"minReplicas": 1})})
    names = [t["name"] for t in build_scaled_object(OWNER, routed)["spec"]["triggers"]]
    assert names == ["waiting-requests", "held-requests"]  # never at zero: nothing to keep awake


def test_every_generated_query_is_valid_promql(tmp_path):
    queries = {
        trigger["metadata"]["query"]
        for name in SPECS
        for kind, obj in desired_objects(OWNER, spec_of(name))
        if kind.kind == "ScaledObject"
        for trigger in obj["spec"]["triggers"]
    }
    running = waiting_requests_query(OWNER).replace("waiting", "running")
    decode_role = waiting_requests_query(OWNER.as_role("decode"))  # spec.disaggregation's scaled role
    leaders = waiting_requests_query(OWNER, groups=True)  # a LeaderWorkerSet's leaders
    assert queries == {waiting_requests_query(OWNER), held_requests_query(OWNER), running, decode_role, leaders}
    generated = check_rules(tmp_path, "generated", sorted(queries))
    assert generated.returncode == 0, generated.stdout + generated.stderr
    assert check_rules(tmp_path, "broken", ['sum(x{a="b") or']).returncode != 0  # promtool does parse them


# --- status: the Gateway's conditions on the route and the pool ---------------------------------

ROUTED = InferenceServiceSpec.model_validate(SPECS["routed-from-zero"])
ROUTE = ROUTED.routing.route
GATEWAY = {
    "group": "gateway.networking.k8s.io",
    "kind": "Gateway",
    "name": "inference-gateway",
    "namespace": "gateways",
}


def with_parents(generation: int = 1, **conditions: tuple[str, str] | None) -> dict:
    """An object of `generation` whose status holds, for the route's Gateway, each condition
    type given as (status, reason), about `generation`."""
    entry = {
        "parentRef": GATEWAY,
        "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
        "conditions": [
            {
                "type": t,
                "status": s,
                "reason": r,
                "message": f"{t} says {r}",
                "observedGeneration": generation,
                "lastTransitionTime": "2026-12-01T00:00:00Z",
            }
            for t, (s, r) in conditions.items()
        ],
    }
    return {"metadata": {"generation": generation}, "status": {"parents": [entry]}}


ACCEPTED = {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}


def test_accepted_route_and_pool_are_no_problem():
    assert routing_problem(OWNER, ROUTE, with_parents(**ACCEPTED), with_parents(**ACCEPTED)) is None


@pytest.mark.parametrize(
    "route, pool, reason, stalled",
    [
        ({"metadata": {"generation": 1}}, with_parents(**ACCEPTED), "RoutePending", False),
        (with_parents(**ACCEPTED), {"metadata": {"generation": 1}}, "PoolPending", False),
        (with_parents(Accepted=("Unknown", "Pending")), with_parents(**ACCEPTED), "RoutePending", False),
        (
            with_parents(generation=1, **ACCEPTED) | {"metadata": {"generation": 2}},
            with_parents(**ACCEPTED),
            "RoutePending",
            False,
        ),
        (with_parents(Accepted=("False", "NotAllowedByListeners")), with_parents(**ACCEPTED), "RouteNotAccepted", True),
        (
            with_parents(Accepted=("True", "Accepted"), ResolvedRefs=("False", "InvalidKind")),
            with_parents(**ACCEPTED),
            "RouteBackendNotResolved",
            True,
        ),
        (with_parents(**ACCEPTED), with_parents(Accepted=("False", "NotSupportedByParent")), "PoolNotAccepted", True),
        (
            with_parents(**ACCEPTED),
            with_parents(Accepted=("True", "Accepted"), ResolvedRefs=("False", "InvalidExtensionRef")),
            "EndpointPickerNotResolved",
            True,
        ),
    ],
)
def test_the_gateways_conditions_decide(route, pool, reason, stalled):
    problem = routing_problem(OWNER, ROUTE, pool, route)
    assert problem is not None and (problem.reason, problem.stalled) == (reason, stalled)
    assert "inference-gateway" in problem.message


def test_another_gateways_acceptance_does_not_count():
    other = with_parents(**ACCEPTED)
    other["status"]["parents"][0]["parentRef"] = {**GATEWAY, "namespace": "elsewhere"}
    assert routing_problem(OWNER, ROUTE, with_parents(**ACCEPTED), other).reason == "RoutePending"


def test_without_a_route_only_a_rejection_of_the_pool_counts():
    assert routing_problem(OWNER, None, {"metadata": {"generation": 1}}, None) is None
    rejected = with_parents(ResolvedRefs=("False", "InvalidExtensionRef"))
    assert routing_problem(OWNER, None, rejected, None).reason == "EndpointPickerNotResolved"


def ready_reason(routing, ready_replicas: int, replicas: int = 1) -> tuple[str, str]:
    deployment = {
        "metadata": {"generation": 1},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": 1,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": ready_replicas,
        },
    }
    conditions = compute_status(OWNER, deployment, [], None, [], "2026-12-01T00:00:00Z", 1, routing)["conditions"]
    ready = next(c for c in conditions if c["type"] == "Ready")
    return ready["status"], ready["reason"]


def test_ready_needs_the_route_accepted_once_the_pods_are():
    pending = routing_problem(OWNER, ROUTE, {"metadata": {"generation": 1}}, {"metadata": {"generation": 1}})
    rejected = routing_problem(
        OWNER, ROUTE, with_parents(**ACCEPTED), with_parents(Accepted=("False", "NotAllowedByListeners"))
    )
    assert ready_reason(None, 1) == ("True", "Available")
    assert ready_reason(pending, 1) == ("False", "RoutePending")
    assert ready_reason(pending, 0) == ("False", "Progressing")  # the pods come first
    assert ready_reason(rejected, 0) == ("False", "RouteNotAccepted")  # someone must act: at once
    assert ready_reason(pending, 0, replicas=0) == ("False", "RoutePending")  # at zero the route is the way in


def test_a_rejection_of_the_pool_outranks_a_route_still_pending():
    pending_route = {"metadata": {"generation": 1}}
    rejected_pool = with_parents(Accepted=("True", "Accepted"), ResolvedRefs=("False", "InvalidExtensionRef"))
    problem = routing_problem(OWNER, ROUTE, rejected_pool, pending_route)
    assert (problem.reason, problem.stalled) == ("EndpointPickerNotResolved", True)


def test_a_parent_without_namespace_is_in_the_objects_own_and_conditions_without_generation_count():
    local = InferenceServiceSpec.model_validate(
        {
            **SPECS["routed-from-zero"],
            "routing": {**SPECS["routed-from-zero"]["routing"], "route": {"gateway": {"name": "gw"}}},
        }
    ).routing.route
    accepted = with_parents(**ACCEPTED)
    entry = accepted["status"]["parents"][0]
    entry["parentRef"] = {"name": "gw"}  # group, kind and namespace left to their defaults
    for condition in entry["conditions"]:
        del condition["observedGeneration"]
    assert routing_problem(OWNER, local, accepted, accepted) is None
    elsewhere = with_parents(**ACCEPTED)
    elsewhere["status"]["parents"][0]["parentRef"] = {"name": "gw", "namespace": "other"}
    assert routing_problem(OWNER, local, accepted, elsewhere).reason == "RoutePending"
