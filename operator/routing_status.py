"""Whether the Gateway took the routing: read from the HTTPRoute's and the InferencePool's own
status, which the Gateway's controller writes per parent Gateway (Accepted, ResolvedRefs).

Only a condition about the object's current generation counts: an older one describes a spec
that is gone. A condition set to False needs someone to act (a listener that allows no routes
from this namespace, a picker Service that does not exist): stalled. No entry yet, or Unknown,
is waiting for the controller: progressing. A rejection of either object outranks waiting."""

from __future__ import annotations

from typing import Any

from argosy.operator.owner import Owner
from argosy.operator.spec import RouteSpec
from argosy.operator.status import Problem, find_condition

# (kind, condition type) -> the reason the InferenceService reports when it is False.
_FALSE_REASONS = {
    ("HTTPRoute", "Accepted"): "RouteNotAccepted",
    ("HTTPRoute", "ResolvedRefs"): "RouteBackendNotResolved",
    ("InferencePool", "Accepted"): "PoolNotAccepted",
    ("InferencePool", "ResolvedRefs"): "EndpointPickerNotResolved",
}
Parents = dict[tuple[str, str], list[dict[str, Any]]]  # (namespace, name) of a Gateway -> conditions


def routing_problem(
    owner: Owner, route: RouteSpec | None, pool: dict[str, Any] | None, http_route: dict[str, Any] | None
) -> Problem | None:
    """Why traffic cannot reach the pods through the pool (and the route, when one is asked
    for), or None. Without a route, only a rejection by any Gateway using the pool counts."""
    objects = [("HTTPRoute", http_route)] if route is not None else []
    objects = [(kind, obj) for kind, obj in [*objects, ("InferencePool", pool)] if obj is not None]
    parents = {kind: current_parents(obj, owner.namespace) for kind, obj in objects}
    for kind, by_gateway in parents.items():
        if (problem := rejection(owner, kind, by_gateway)) is not None:
            return problem
    if route is None:
        return None
    gateway = (route.gateway.namespace or owner.namespace, route.gateway.name)
    for kind, by_gateway in parents.items():
        accepted = find_condition(by_gateway.get(gateway, []), "Accepted")
        if accepted is None or accepted.get("status") != "True":
            return Problem(
                "RoutePending" if kind == "HTTPRoute" else "PoolPending",
                f"{kind} {owner.name} is not accepted by Gateway {gateway[0]}/{gateway[1]} yet",
                stalled=False,
            )
    return None


def rejection(owner: Owner, kind: str, by_gateway: Parents) -> Problem | None:
    for (namespace, name), conditions in by_gateway.items():
        for condition_type in ("Accepted", "ResolvedRefs"):
            condition = find_condition(conditions, condition_type)
            if condition is not None and condition.get("status") == "False":
                return Problem(
                    _FALSE_REASONS[kind, condition_type],
                    f"{kind} {owner.name}, Gateway {namespace}/{name}: {condition_type} is False "
                    f"({condition.get('reason')}): {condition.get('message') or 'no message'}",
                )
    return None


def current_parents(obj: dict[str, Any], namespace: str) -> Parents:
    """Each parent Gateway and its conditions about the object's current generation; a
    parentRef without a namespace means the object's own."""
    generation = (obj.get("metadata") or {}).get("generation", 1)
    parents: Parents = {}
    for entry in (obj.get("status") or {}).get("parents") or []:
        ref = entry.get("parentRef") or {}
        if ref.get("kind", "Gateway") != "Gateway":
            continue
        current = [c for c in entry.get("conditions") or [] if c.get("observedGeneration", generation) >= generation]
        parents.setdefault((ref.get("namespace") or namespace, ref.get("name", "")), []).extend(current)
    return parents
