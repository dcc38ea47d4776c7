"""The RouterReady condition: whether the router the operator runs has a ready replica, read from its
Deployment. It stands beside Ready (the pods serving), which it does not change: clients that reach
the pods through the Service or a Gateway are served while the router is down."""

from __future__ import annotations

from typing import Any

from argosy.operator.status import condition


def router_condition(
    deployment: dict[str, Any] | None, generation: int, previous: list[dict[str, Any]], now: str
) -> dict[str, Any]:
    if deployment is None:
        state = ("False", "RouterPending", "the router's Deployment has not been created")
    else:
        status = deployment.get("status") or {}
        ready, desired = status.get("readyReplicas", 0), (deployment.get("spec") or {}).get("replicas", 1)
        stuck = next(
            (
                c
                for c in status.get("conditions") or []
                if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
            ),
            None,
        )
        if ready >= 1:
            state = ("True", "RouterAvailable", f"{ready}/{desired} router replicas ready")
        elif stuck is not None:
            state = ("False", "RouterProgressDeadlineExceeded", stuck.get("message") or "the router does not start")
        else:
            state = ("False", "RouterProgressing", f"{ready}/{desired} router replicas ready")
    return condition("RouterReady", *state, generation, previous, now)
