"""The InferenceService status, computed from what the cluster shows: the owned Deployment,
its pods, and any problem the reconcile met. Conditions follow kstatus (Ready, plus
Reconciling and Stalled) so Argo CD and Flux can tell healthy from progressing from stuck."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from argosy.operator.labels import selector_string, service_url
from argosy.operator.owner import Owner
from argosy.server.exceptions import CheckpointNotFoundError

# Waiting reasons that will not clear without someone changing something.
_STUCK_CONTAINER = {
    "ErrImagePull": "ImagePullFailed",
    "ImagePullBackOff": "ImagePullFailed",
    "InvalidImageName": "ImagePullFailed",
    "CreateContainerConfigError": "ContainerConfigError",
    "CreateContainerError": "ContainerConfigError",
    "RunContainerError": "ContainerConfigError",
}


@dataclass(frozen=True)
class Problem:
    """Why the service is not ready; reason is CamelCase as Kubernetes reasons are. A stalled
    problem needs someone to act; the others (a pod waiting for a node) may clear by themselves.
    A retryable problem met by the reconcile itself (KEDA installed later, a conflicting object
    removed) is retried with growing delays."""

    reason: str
    message: str
    stalled: bool = True
    retryable: bool = False


def diagnose_pods(pods: list[dict[str, Any]]) -> Problem | None:
    """The first problem among the pods: unschedulable, image pull, bad container config,
    missing model, crash loop."""
    for pod in pods:
        status = pod.get("status") or {}
        for container in status.get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in _STUCK_CONTAINER:
                return Problem(
                    _STUCK_CONTAINER[reason], waiting.get("message") or f"{reason}: {container.get('image')}"
                )
            if reason == "CrashLoopBackOff":
                last = (container.get("lastState") or {}).get("terminated") or {}
                line = ((last.get("message") or "").strip().splitlines() or ["the server keeps exiting"])[-1][:500]
                missing = last.get("exitCode") == CheckpointNotFoundError.exit_code
                return Problem("ModelPathMissing" if missing else "CrashLoopBackOff", line)
        for cond in status.get("conditions") or []:
            if (
                cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"
            ):
                # A cluster autoscaler may be adding a node: waiting, not stuck.
                return Problem("PodsUnschedulable", cond.get("message") or "no node fits the pod", stalled=False)
    return None


def _deployment_problem(deployment: dict[str, Any]) -> Problem | None:
    for cond in (deployment.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return Problem("ProgressDeadlineExceeded", cond.get("message") or "the rollout stopped progressing")
    return None


def compute_status(
    owner: Owner,
    deployment: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    problem: Problem | None,
    previous: list[dict[str, Any]],
    now: str,
    min_ready: int | None = None,
    routing: Problem | None = None,
) -> dict[str, Any]:
    """min_ready: with autoscaling, the replicas that make the service ready (the HPA moves
    the desired count up and down; that is not a rollout). Without, all desired replicas.
    routing: why the Gateway does not route to the pods yet; it decides once the pods are
    fine, or at once when someone must act."""
    dep_status = (deployment or {}).get("status") or {}
    desired = ((deployment or {}).get("spec") or {}).get("replicas", 1)
    ready = dep_status.get("readyReplicas", 0)
    needed = desired if min_ready is None else min(desired, min_ready)
    rolled_out = deployment is not None and _rolled_out(deployment, desired, autoscaled=min_ready is not None)
    serving = rolled_out and ready >= needed
    if problem is None and deployment is not None and not serving:
        problem = _deployment_problem(deployment) or diagnose_pods(pods)
    if problem is None and routing is not None and (routing.stalled or serving):
        problem = routing
    if problem is not None:
        state = ("False", problem.reason, problem.message)
    elif deployment is None:
        state = ("False", "Pending", "the Deployment has not been created yet")
    elif rolled_out and desired == 0:
        state = ("True", "ScaledToZero", "no replicas are wanted")
    elif serving:
        state = ("True", "Available", f"{ready}/{desired} replicas ready")
    else:
        state = ("False", "Progressing", f"{ready}/{desired} replicas ready")
    ready_status, reason, message = state
    stalled = problem is not None and problem.stalled
    conditions = kstatus_conditions(ready_status, reason, message, stalled, owner.generation, previous, now)
    return {
        "observedGeneration": owner.generation,
        "replicas": dep_status.get("replicas", 0),
        "readyReplicas": ready,
        "selector": selector_string(owner),
        "url": service_url(owner),
        "conditions": conditions,
    }


def kstatus_conditions(
    ready: str, reason: str, message: str, stalled: bool, generation: int, previous: list[dict[str, Any]], now: str
) -> list[dict[str, Any]]:
    """Ready, and Reconciling or Stalled as kstatus reads them: not ready and not stalled is
    reconciling."""
    reconciling = ready == "False" and not stalled
    return [
        condition("Ready", ready, reason, message, generation, previous, now),
        condition(
            "Reconciling",
            "True" if reconciling else "False",
            reason if reconciling else "Reconciled",
            message if reconciling else "",
            generation,
            previous,
            now,
        ),
        condition(
            "Stalled",
            "True" if stalled else "False",
            reason if stalled else "NotStalled",
            message if stalled else "",
            generation,
            previous,
            now,
        ),
    ]


def _rolled_out(deployment: dict[str, Any], desired: int, autoscaled: bool) -> bool:
    """The Deployment saw its latest spec and no pod of an older template is left (and,
    unless the HPA is moving the count, every desired pod exists)."""
    meta, status = deployment.get("metadata") or {}, deployment.get("status") or {}
    observed = status.get("observedGeneration", 0) >= meta.get("generation", 1)
    updated, current = status.get("updatedReplicas", 0), status.get("replicas", 0)
    return observed and current <= updated and (autoscaled or updated >= desired)


def condition(
    kind: str, status: str, reason: str, message: str, generation: int, previous: list[dict[str, Any]], now: str
) -> dict[str, Any]:
    before = find_condition(previous, kind)
    since = (
        before["lastTransitionTime"]
        if before and before.get("status") == status and before.get("lastTransitionTime")
        else now
    )
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    }


def now() -> str:
    """The time as conditions and status entries write it."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find_condition(conditions: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def ready_condition(status: dict[str, Any]) -> dict[str, Any] | None:
    return find_condition(status.get("conditions") or [], "Ready")
