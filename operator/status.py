"""The InferenceService status, computed from what the cluster shows: the owned Deployment,
its pods, and any problem the reconcile met. Conditions follow kstatus (Ready, plus
Reconciling and Stalled) so Argo CD and Flux can tell healthy from progressing from stuck."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from argosy.operator.labels import selector_string, service_url
from argosy.operator.spec import Owner

# Messages the server prints when it cannot find its checkpoint (see argosy.server.errors).
_MODEL_MISSING_MARKERS = ("checkpoint folder not found", "config.json: file not found", "no *.safetensors")


@dataclass(frozen=True)
class Problem:
    """Why the service cannot become ready; reason is CamelCase as Kubernetes reasons are."""

    reason: str
    message: str


def diagnose_pods(pods: list[dict[str, Any]]) -> Problem | None:
    """The first blocking problem among the pods: unschedulable, image pull, missing model, crash loop."""
    for pod in pods:
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                    and cond.get("reason") == "Unschedulable":
                return Problem("PodsUnschedulable", cond.get("message") or "no node fits the pod")
        for container in status.get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName"):
                return Problem("ImagePullFailed", waiting.get("message") or f"cannot pull {container.get('image')}")
            if reason == "CrashLoopBackOff":
                last = ((container.get("lastState") or {}).get("terminated") or {}).get("message") or ""
                if any(marker in last for marker in _MODEL_MISSING_MARKERS):
                    return Problem("ModelPathMissing", last.strip().splitlines()[-1][:500])
                return Problem("CrashLoopBackOff", (last.strip().splitlines() or ["the server keeps exiting"])[-1][:500])
    return None


def compute_status(owner: Owner, deployment: dict[str, Any] | None, pods: list[dict[str, Any]],
                   problem: Problem | None, previous: list[dict[str, Any]], now: str) -> dict[str, Any]:
    dep_status = (deployment or {}).get("status") or {}
    desired = ((deployment or {}).get("spec") or {}).get("replicas", 1)
    ready = dep_status.get("readyReplicas", 0)
    problem = problem or diagnose_pods(pods)
    rolled_out = deployment is not None and _rolled_out(deployment, desired)
    if problem is not None:
        state = ("False", problem.reason, problem.message)
    elif deployment is None:
        state = ("False", "Pending", "the Deployment has not been created yet")
    elif rolled_out and desired == 0:
        state = ("True", "ScaledToZero", "no replicas are wanted; requests will scale it up")
    elif rolled_out and ready >= desired:
        state = ("True", "Available", f"{ready}/{desired} replicas ready")
    else:
        state = ("False", "Progressing", f"{ready}/{desired} replicas ready")
    ready_status, reason, message = state
    conditions = [
        _condition("Ready", ready_status, reason, message, owner.generation, previous, now),
        _condition("Reconciling", "True" if reason in ("Pending", "Progressing") else "False",
                   reason if reason in ("Pending", "Progressing") else "Reconciled", message, owner.generation,
                   previous, now),
        _condition("Stalled", "True" if problem else "False", problem.reason if problem else "NotStalled",
                   problem.message if problem else "", owner.generation, previous, now),
    ]
    return {"observedGeneration": owner.generation, "replicas": dep_status.get("replicas", 0),
            "readyReplicas": ready, "selector": selector_string(owner), "url": service_url(owner),
            "conditions": conditions}


def _rolled_out(deployment: dict[str, Any], desired: int) -> bool:
    meta, status = deployment.get("metadata") or {}, deployment.get("status") or {}
    observed = status.get("observedGeneration", 0) >= meta.get("generation", 1)
    return observed and status.get("updatedReplicas", 0) >= desired and status.get("replicas", 0) <= desired


def _condition(kind: str, status: str, reason: str, message: str, generation: int,
               previous: list[dict[str, Any]], now: str) -> dict[str, Any]:
    before = next((c for c in previous if c.get("type") == kind), None)
    since = before["lastTransitionTime"] if before and before.get("status") == status \
        and before.get("lastTransitionTime") else now
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": since}


def ready_condition(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
