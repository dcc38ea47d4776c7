"""InferenceService with spec.disaggregation -> its two roles' pods and what reads them. Each role
(prefill, decode) is a Deployment `<name>-<role>` of its own, its pods labelled with the role and
started with the P/D KV connector (the pod's address from $(POD_IP)), and, with the role's own
autoscaling, a ScaledObject on that role's waiting queue. The router of spec.routing.router runs
in its P/D mode, finding each role's pods by its selector. The service's Service and
PodDisruptionBudget select both roles' pods. The status sums the roles' pods and is ready when
both are; each role's own counts and state are in status.roles."""

from __future__ import annotations

from typing import Any

from argosy.operator.deployment import build_deployment
from argosy.operator.kinds import DEPLOYMENT, SCALED_OBJECT, Kind
from argosy.operator.labels import selector_labels, selector_string
from argosy.operator.owner import Owner
from argosy.operator.scaledobject import build_scaled_object
from argosy.operator.spec import ROLES, InferenceServiceSpec
from argosy.operator.status import Problem, compute_status


def role_suffixes() -> list[str]:
    return [f"-{role}" for role in ROLES]


def build_role_objects(owner: Owner, spec: InferenceServiceSpec, cache_root: str) -> list[tuple[Kind, dict[str, Any]]]:
    objects = []
    for role in ROLES:
        role_owner, role_spec = owner.as_role(role), spec.role(role)
        objects.append((DEPLOYMENT, build_deployment(role_owner, role_spec, cache_root)))
        if role_spec.autoscaling is not None:
            objects.append((SCALED_OBJECT, build_scaled_object(role_owner, role_spec)))
    return objects


def pd_router_args(owner: Owner) -> list[str]:
    """The router's P/D mode, each role's pods found by their selector."""
    args = ["--vllm-pd-disaggregation"]
    for role in ROLES:
        labels = selector_labels(owner.as_role(role))
        args += [f"--{role}-selector", *(f"{key}={value}" for key, value in labels.items())]
    return args


def disaggregated_status(
    owner: Owner,
    spec: InferenceServiceSpec,
    live: dict[str, dict | None],
    pods: dict[str, list],
    problem: Problem | None,
    previous: list[dict[str, Any]],
    now: str,
    routing: Problem | None = None,
) -> dict[str, Any]:
    """`live` and `pods`: each role's Deployment (as applied) and pods. The first role not ready
    speaks for the service; both ready, the decode role does."""
    by_role = {}
    for role in ROLES:
        role_owner, role_spec = owner.as_role(role), spec.role(role)
        autoscaling = role_spec.autoscaling
        min_ready = max(1, autoscaling.minReplicas) if autoscaling is not None else None
        by_role[role] = compute_status(role_owner, live[role], pods[role], problem, previous, now, min_ready, routing)
    ready = lambda status: status["conditions"][0]["status"] == "True"  # noqa: E731
    speaking = next((by_role[role] for role in ROLES if not ready(by_role[role])), by_role[ROLES[-1]])
    status = {**speaking, "selector": selector_string(owner)}
    status["replicas"] = sum(s["replicas"] for s in by_role.values())
    status["readyReplicas"] = sum(s["readyReplicas"] for s in by_role.values())
    status["roles"] = {
        role: {"replicas": s["replicas"], "readyReplicas": s["readyReplicas"], "reason": s["conditions"][0]["reason"]}
        for role, s in by_role.items()
    }
    return status
