"""One reconciliation of a ModelCache by the operator: its counts and conditions, from the
nodes and the agents' entries. The operator builds nothing for a ModelCache: the agents,
a DaemonSet of the chart's, do the copying."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from argosy.operator.kinds import MODEL_CACHE, NODE
from argosy.operator.kube import KubeClient
from argosy.operator.model_cache.spec import ModelCacheSpec
from argosy.operator.model_cache.status import cache_status
from argosy.operator.owner import Owner
from argosy.operator.reconcile import ReconcileResult
from argosy.operator.status import Problem, kstatus_conditions, now


def reconcile_cache(kube: KubeClient, body: dict[str, Any], cache_root: str) -> ReconcileResult:
    owner = Owner.from_body(body, MODEL_CACHE)
    status = body.get("status") or {}
    previous = status.get("conditions") or []
    try:
        spec = ModelCacheSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:  # the CRD schema should have stopped this
        problem = Problem("InvalidSpec", str(exc).splitlines()[0])
        conditions = kstatus_conditions(
            "False", problem.reason, problem.message, True, owner.generation, previous, now()
        )
        return ReconcileResult({"observedGeneration": owner.generation, "conditions": conditions}, problem)
    nodes = kube.list(NODE, None)
    return ReconcileResult(
        cache_status(spec, owner.generation, nodes, status.get("nodes") or {}, previous, now()), None
    )
