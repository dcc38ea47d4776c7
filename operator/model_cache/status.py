"""The ModelCache's status as the operator computes it: the nodes it selects, those whose copy
is ready (from the agents' entries), and kstatus conditions; and what an InferenceService that
uses it reports."""

from __future__ import annotations

from typing import Any

from argosy.operator.model_cache.nodes import selects
from argosy.operator.model_cache.spec import ModelCacheSpec
from argosy.operator.status import Problem, kstatus_conditions, ready_condition

STALLED_ATTEMPTS = 3  # a node failing this often needs someone to look


def cache_status(
    spec: ModelCacheSpec,
    generation: int,
    nodes: list[dict[str, Any]],
    entries: dict[str, dict[str, Any]],
    previous: list[dict[str, Any]],
    now: str,
) -> dict[str, Any]:
    """`entries`: the agents' per-node entries. Entries of nodes that no longer exist are
    dropped (set to None, for the merge patch)."""
    names = {n["metadata"]["name"] for n in nodes}
    selected = sorted(n["metadata"]["name"] for n in nodes if selects(spec, n))
    mine = {name: entries[name] for name in selected if name in entries}
    ready = sum(1 for e in mine.values() if e.get("phase") == "Ready")
    ready_status, reason, message, stalled = _state(selected, mine, ready)
    status = {
        "observedGeneration": generation,
        "desiredNodes": len(selected),
        "readyNodes": ready,
        "conditions": kstatus_conditions(ready_status, reason, message, stalled, generation, previous, now),
    }
    gone = {name: None for name in entries if name not in names}
    if gone:
        status["nodes"] = gone
    return status


def _state(selected: list[str], entries: dict[str, dict[str, Any]], ready: int) -> tuple[str, str, str, bool]:
    desired = len(selected)
    counts = f"ready on {ready}/{desired} nodes"
    if not desired:
        return "False", "NoNodesSelected", "no node matches spec.nodeSelector and spec.tolerations", True
    if ready == desired:
        return "True", "AllNodesReady", counts, False
    for name, entry in entries.items():
        if entry.get("phase") == "Failed" and entry.get("attempts", 0) >= STALLED_ATTEMPTS:
            return "False", entry.get("reason") or "CopyFailed", f"{counts}; {name}: {entry.get('message')}", True
    for name, entry in entries.items():
        if entry.get("reason") == "QuotaExceeded":
            return "False", "QuotaExceeded", f"{counts}; {name}: {entry.get('message')}", True
    waiting = [name for name in selected if entries.get(name, {}).get("phase") != "Ready"]
    under_way = [f"{name} {_progress(entries.get(name, {}))}" for name in waiting]
    return "False", "Copying", f"{counts}; {', '.join(under_way)}", False


def _progress(entry: dict[str, Any]) -> str:
    phase = entry.get("phase", "Pending")
    total = entry.get("bytesTotal") or 0
    if phase in ("Copying", "Verifying") and total:
        return f"{phase} {100 * (entry.get('bytesDone') or 0) // total}%"
    return phase if not entry.get("reason") else f"{phase} ({entry['reason']})"


def service_cache(name: str, cache: dict[str, Any] | None, max_replicas: int | None) -> tuple[dict, Problem | None]:
    """What an InferenceService using the ModelCache `name` reports of it (its status'
    modelCache), and the problem that keeps its pods waiting, if any."""
    if cache is None:
        message = f"spec.model.cacheRef names ModelCache {name}, which does not exist in this namespace"
        return {"name": name, "readyNodes": 0}, Problem("ModelCacheNotFound", message)
    status = cache.get("status") or {}
    ready, desired = status.get("readyNodes") or 0, status.get("desiredNodes") or 0
    report = {"name": name, "readyNodes": ready, "desiredNodes": desired}
    if max_replicas is not None and max_replicas > ready:
        report["message"] = (
            f"autoscaling.maxReplicas ({max_replicas}) is more than the nodes holding a ready copy ({ready}): "
            "replicas beyond what those nodes fit stay Pending"
        )
    if ready:
        return report, None
    why = (ready_condition(status) or {}).get("message") or "no node holds a ready copy yet"
    return report, Problem("ModelCacheNotReady", f"waiting for ModelCache {name}: {why}", stalled=False)
