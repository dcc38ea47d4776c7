"""kopf handlers. Each is short: find the object, reconcile it, record the status, post an
Event when something changed. The decisions live in reconcile.py and the builders.

Handlers are registered per Controller: one of Argosy's kinds (its description), the function
that reconciles an object of it, and the kinds it creates, whose changes reconcile their owner.
A ModelCache is reconciled on every change, its status included: the agents write their
entries there, so a node that comes to hold a copy, or stops, is counted then (a timer would
cost every ModelCache a kopf finalizer). Every InferenceService that uses it is reconciled too,
as is every one whose objectives name an engine profile's ConfigMap that changed (those labelled
managed-by argosy-profile: the API server filters the ConfigMap watch to them and Argosy's own)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import kopf

from argosy.operator.coalesced_runs import CoalescedRuns
from argosy.operator.custom_resource import CustomResource
from argosy.operator.kinds import CONFIG_MAP, GROUP, INFERENCE_SERVICE, MODEL_CACHE, OWNED_KINDS, Kind
from argosy.operator.kube import KubeClient
from argosy.operator.labels import MANAGED_BY, MANAGED_BY_LABEL, PROFILE_MANAGED_BY
from argosy.operator.model_cache.nodes import DEFAULT_CACHE_ROOT
from argosy.operator.model_cache.reconcile import reconcile_cache
from argosy.operator.model_cache.resource import MODEL_CACHE_RESOURCE
from argosy.operator.reconcile import ReconcileResult, reconcile
from argosy.operator.resource import INFERENCE_SERVICE_RESOURCE
from argosy.operator.status import ready_condition

MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
CONFIG_MAP_SELECTOR = f"{MANAGED_BY_LABEL} in ({MANAGED_BY},{PROFILE_MANAGED_BY})"
MAX_RETRY_DELAY = 300

# Keyed by (plural, namespace, name): an object's reconciles never overlap, and fold together.
RECONCILES = CoalescedRuns()


@dataclass(frozen=True)
class Controller:
    resource: CustomResource
    reconcile: Callable[[KubeClient, dict[str, Any], str], ReconcileResult]  # (kube, body, the nodes' cache root)
    owned: tuple[Kind, ...]
    handler_id: str  # kopf's id of the reconcile handler: its progress annotations carry it
    on_every_change: bool = False  # status changes too: others write its status


SERVICES = Controller(INFERENCE_SERVICE_RESOURCE, reconcile, OWNED_KINDS, "reconcile_service")
CACHES = Controller(MODEL_CACHE_RESOURCE, reconcile_cache, (), "reconcile_modelcache", on_every_change=True)
CONTROLLERS = (SERVICES, CACHES)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # Events come from _reconcile, not from log lines
    for controller in CONTROLLERS:  # watch only our own objects, filtered by the API server
        for kind in controller.owned:
            settings.watching.label_selectors[kind.resource] = MANAGED_SELECTOR
    settings.watching.label_selectors[CONFIG_MAP.resource] = CONFIG_MAP_SELECTOR
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    memo.kube = KubeClient.from_environment()
    memo.cache_root = memo.get("cache_root") or DEFAULT_CACHE_ROOT


def register(controller: Controller) -> None:
    kind = controller.resource.kind

    def reconcile_object(namespace: str, name: str, memo: kopf.Memo, retry: int, **_: Any) -> None:
        problem = _reconcile(memo.kube, controller, namespace, name, memo.cache_root, wait=True)
        if problem is not None and problem.retryable:
            delay = min(MAX_RETRY_DELAY, 10 * 2**retry)
            raise kopf.TemporaryError(f"{problem.reason}: {problem.message}", delay=delay)

    def owned_object_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        """An owned object changed (rollout progress, a pod failing, someone's edit): reconcile
        its owner so that status follows and drift is put back."""
        meta = body.get("metadata") or {}
        name = (meta.get("labels") or {}).get(kind.owner_label)
        if name is not None:
            _reconcile(memo.kube, controller, meta["namespace"], name, memo.cache_root)

    def object_changed(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
        meta = body.get("metadata") or {}
        if type != "DELETED":
            _reconcile(memo.kube, controller, meta["namespace"], meta["name"], memo.cache_root)

    if controller.on_every_change:
        kopf.on.event(*kind.resource, id=controller.handler_id)(object_changed)
    else:
        for on in (kopf.on.resume, kopf.on.create, kopf.on.update):
            on(*kind.resource, id=controller.handler_id)(reconcile_object)
    for owned in controller.owned:
        kopf.on.event(*owned.resource, id=f"{kind.plural}/owned_object_changed")(owned_object_changed)


for _controller in CONTROLLERS:
    register(_controller)


@kopf.on.event(*MODEL_CACHE.resource, id="modelcaches/services_using")
def cache_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A ModelCache's copies changed: the services that use it report it, and may run now."""
    _reconcile_services_naming(memo, body, lambda spec: ((spec.get("model") or {}).get("cacheRef") or {}).get("name"))


@kopf.on.event(*CONFIG_MAP.resource, labels={MANAGED_BY_LABEL: PROFILE_MANAGED_BY}, id="configmaps/profiles")
def profile_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """An engine profile changed: the services whose objectives name it derive their thresholds again."""
    _reconcile_services_naming(
        memo, body, lambda spec: ((spec.get("autoscaling") or {}).get("objectives") or {}).get("profileConfigMap")
    )


def _reconcile_services_naming(memo: kopf.Memo, body: kopf.Body, reference: Callable[[dict], str | None]) -> None:
    """Reconciles the InferenceServices of the object's namespace whose spec names it (`reference(spec)`)."""
    meta = body.get("metadata") or {}
    for service in memo.kube.list(INFERENCE_SERVICE, meta["namespace"]):
        if reference(service.get("spec") or {}) == meta["name"]:
            _reconcile(memo.kube, SERVICES, meta["namespace"], service["metadata"]["name"], memo.cache_root)


def _reconcile(
    kube: KubeClient, controller: Controller, namespace: str, name: str, cache_root: str, wait: bool = False
):
    """Reconciles the object as it is now, or has the reconcile going now run once more (see
    CoalescedRuns); with `wait`, returns the problem of a run begun after this call."""
    run = partial(_reconcile_now, kube, controller, namespace, name, cache_root)
    return RECONCILES.request((controller.resource.kind.plural, namespace, name), run, wait)


def _reconcile_now(kube: KubeClient, controller: Controller, namespace: str, name: str, cache_root: str):
    """One reconcile. It reads the spec afresh, so a late one never undoes a newer spec."""
    kind = controller.resource.kind
    body = kube.get(kind, namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return None
    result = controller.reconcile(kube, body, cache_root)
    before = body.get("status") or {}
    if result.status != {k: before.get(k) for k in result.status}:
        kube.patch(kind, namespace, name, {"status": result.status}, subresource="status")
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
