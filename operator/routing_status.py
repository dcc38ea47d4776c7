"""Whether the Gateway took the routing: read from the HTTPRoute's and the InferencePool's own
status, which the Gateway's controller writes per parent Gateway (Accepted, ResolvedRefs).

Only a condition about the object's current generation counts: an older one describes a spec
that is gone. A condition set to False needs someone to act (a listener that allows no routes
from this namespace, a picker Service that does not exist): stalled. No entry yet, or Unknown,
is waiting for the controller: progressing."""

from __future__ import annotations

from typing import Any

from argosy.operator.spec import Owner, RouteSpec
from argosy.operator.status import Problem, find_condition

# (kind, condition type) -> the reason the InferenceService reports when it is False.
_FALSE_REASONS = {
    ("HTTPRoute", "Accepted"): "RouteNotAccepted",
    ("HTTPRoute", "ResolvedRefs"): "RouteBackendNotResolved",
    ("InferencePool", "Accepted"): "PoolNotAccepted",
    ("InferencePool", "ResolvedRefs"): "EndpointPickerNotResolved",
}


def routing_problem(
    owner: Owner, route: RouteSpec | None, pool: dict[str, Any] | None, http_route: dict[str, Any] | None
) -> Problem | None:
    """Why traffic cannot reach the pods through the pool (and the route, when one is asked
    for), or None. Without a route, only a rejection by any Gateway using the pool counts."""
    gateway = (route.gateway.namespace or owner.namespace, route.gateway.name) if route is not None else None
    checks = [(http_route, "HTTPRoute")] if route is not None else []
    for obj, kind in [*checks, (pool, "InferencePool")]:
        if obj is None:
            continue
        parents = _current_parents(obj, owner.namespace)
        for parent, conditions in parents.items():
            for condition_type in ("Accepted", "ResolvedRefs"):
                condition = find_condition(conditions, condition_type)
                if condition is not None and condition.get("status") == "False":
                    return Problem(
                        _FALSE_REASONS[kind, condition_type],
                        f"{kind} {owner.name}, Gateway {parent[0]}/{parent[1]}: {condition_type} is False "
                        f"({condition.get('reason')}): {condition.get('message') or 'no message'}",
                    )
        if gateway is not None:
            accepted = find_condition(parents.get(gateway, []), "Accepted")
            if accepted is None or accepted.get("status") != "True":
                return Problem(
                    "RoutePending" if kind == "HTTPRoute" else "PoolPending",
                    f"{kind} {owner.name} is not accepted by Gateway {gateway[0]}/{gateway[1]} yet",
                    stalled=False,
                )
    return None


def _current_parents(obj: dict[str, Any], namespace: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Each parent Gateway (namespace, name) and its conditions about the current generation."""
    generation = (obj.get("metadata") or {}).get("generation", 1)
    parents: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for entry in (obj.get("status") or {}).get("parents") or []:
        ref = entry.get("parentRef") or {}
        if ref.get("kind", "Gateway") != "Gateway":
            continue
        current = [c for c in entry.get("conditions") or [] if c.get("observedGeneration", generation) >= generation]
        parents.setdefault((ref.get("namespace") or namespace, ref.get("name", "")), []).extend(current)
    return parents
