"""kopf handlers. Each is short: find the InferenceService, reconcile it, record the status,
post an Event when something changed. The decisions live in reconcile.py and the builders."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from typing import Any

import kopf

from argosy.operator.kube import INFERENCE_SERVICE, OWNED_KINDS, KubeClient
from argosy.operator.labels import MANAGED_BY, OWNER_LABEL
from argosy.operator.reconcile import reconcile
from argosy.operator.status import ready_condition

MANAGED_SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"
MAX_RETRY_DELAY = 300

# One lock per InferenceService: its reconciles never overlap.
RECONCILE_LOCKS: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # Events come from _reconcile, not from log lines
    for kind in OWNED_KINDS:  # watch only our own objects, filtered by the API server
        settings.watching.label_selectors[kind.resource] = MANAGED_SELECTOR
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="argosy.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="argosy.dev", key="last-handled-configuration"
    )
    memo.kube = KubeClient.from_environment()


@kopf.on.resume(*INFERENCE_SERVICE.resource)
@kopf.on.create(*INFERENCE_SERVICE.resource)
@kopf.on.update(*INFERENCE_SERVICE.resource)
def reconcile_service(namespace: str, name: str, memo: kopf.Memo, retry: int, **_: Any) -> None:
    problem = _reconcile(memo.kube, namespace, name)
    if problem is not None and problem.retryable:
        raise kopf.TemporaryError(f"{problem.reason}: {problem.message}", delay=min(MAX_RETRY_DELAY, 10 * 2**retry))


def owned_object_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """An owned object changed (rollout progress, a pod failing, someone's edit): reconcile
    its InferenceService so that status follows and drift is put back."""
    meta = body.get("metadata") or {}
    name = (meta.get("labels") or {}).get(OWNER_LABEL)
    if name is not None:
        _reconcile(memo.kube, meta["namespace"], name)


for _kind in OWNED_KINDS:
    owned_object_changed = kopf.on.event(*_kind.resource)(owned_object_changed)


def _reconcile(kube: KubeClient, namespace: str, name: str):
    """Reconciles the InferenceService as it is now. Reconciles of one service never overlap,
    and each reads the spec afresh, so a late one never undoes a newer spec."""
    with RECONCILE_LOCKS[namespace, name]:
        body = kube.get(INFERENCE_SERVICE, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        result = reconcile(kube, body)
        before = body.get("status") or {}
        if result.status != {k: before.get(k) for k in result.status}:
            kube.patch(INFERENCE_SERVICE, namespace, name, {"status": result.status}, subresource="status")
    for change in result.changes:
        kopf.event(body, type="Normal", reason="Reconciled", message=change)
    was, now = ready_condition(before) or {}, ready_condition(result.status) or {}
    if (was.get("status"), was.get("reason")) != (now.get("status"), now.get("reason")):
        healthy = now.get("status") == "True" or now.get("reason") == "Progressing"
        kopf.event(
            body,
            type="Normal" if healthy else "Warning",
            reason=now.get("reason", "Unknown"),
            message=now.get("message", ""),
        )
    return result.problem
