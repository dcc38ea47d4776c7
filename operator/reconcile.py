"""One reconciliation of an InferenceService: build the desired objects, create what is
missing, put back what drifted, leave alone what is right, and compute the status. The
decisions are the pure builders'; this module only carries them to the API."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from argosy.operator.adapters_config import build_adapters_config_map, lora_enabled
from argosy.operator.deployment import build_deployment
from argosy.operator.disaggregation import build_role_objects, disaggregated_status, role_suffixes
from argosy.operator.drift import differences, last_applied, merge_patch, with_last_applied
from argosy.operator.kinds import (
    CONFIG_MAP,
    DEPLOYMENT,
    HTTP_ROUTE,
    INFERENCE_POOL,
    LEADER_WORKER_SET,
    MODEL_CACHE,
    PDB,
    POD,
    ROLE,
    ROLE_BINDING,
    SCALED_OBJECT,
    SERVICE,
    SERVICE_ACCOUNT,
    Kind,
)
from argosy.operator.kube import KindNotInstalled, KubeClient
from argosy.operator.labels import selector_string
from argosy.operator.leader_worker_set import build_leader_worker_set, spans_pods
from argosy.operator.model_cache.nodes import DEFAULT_CACHE_ROOT
from argosy.operator.model_cache.status import service_cache
from argosy.operator.objectives import Thresholds, thresholds_from_config_map
from argosy.operator.owner import Owner
from argosy.operator.router import ROUTER_SUFFIX, build_router_objects, router_name, router_url
from argosy.operator.router_status import router_condition
from argosy.operator.routing import build_http_route, build_inference_pool
from argosy.operator.routing_status import routing_problem
from argosy.operator.scaledobject import build_scaled_object
from argosy.operator.service import build_pdb, build_service
from argosy.operator.spec import ROLES, InferenceServiceSpec
from argosy.operator.status import Problem, compute_status, now

# Kinds that come with add-ons: what the service needs them for, reported when they are missing.
ADD_ON_KINDS = {
    SCALED_OBJECT: ("KEDANotInstalled", "autoscaling needs KEDA"),
    HTTP_ROUTE: ("GatewayAPINotInstalled", "a route needs the Gateway API's CRDs"),
    INFERENCE_POOL: ("InferencePoolNotInstalled", "routing needs the Gateway API Inference Extension's CRDs"),
    LEADER_WORKER_SET: ("LeaderWorkerSetNotInstalled", "a model spanning pods needs LeaderWorkerSet's CRDs"),
}
# Objects only some specs have, by kind and name suffix, in the order they go when the spec drops
# them: the ScaledObject before the replica count returns to the Deployment, a route before the pool
# it sends to, the router before its permissions.
# A disaggregated service's roles replace its one Deployment, and the other way round; so does the
# LeaderWorkerSet of a model that spans pods.
OPTIONAL_OBJECTS = (
    *((SCALED_OBJECT, suffix) for suffix in ("", *role_suffixes())),
    (HTTP_ROUTE, ""),
    (INFERENCE_POOL, ""),
    (CONFIG_MAP, ""),
    *((kind, ROUTER_SUFFIX) for kind in (DEPLOYMENT, SERVICE, ROLE_BINDING, ROLE, SERVICE_ACCOUNT)),
    *((DEPLOYMENT, suffix) for suffix in ("", *role_suffixes())),
    (LEADER_WORKER_SET, ""),
)


@dataclass
class ReconcileResult:
    status: dict[str, Any]
    problem: Problem | None
    changes: list[str] = field(default_factory=list)  # "created Deployment x", "restored Service x"


def desired_objects(
    owner: Owner, spec: InferenceServiceSpec, cache_root: str = DEFAULT_CACHE_ROOT, thresholds: Thresholds | None = None
) -> list[tuple[Kind, dict[str, Any]]]:
    if spec.disaggregation is not None:
        objects = build_role_objects(owner, spec, cache_root)
    elif spans_pods(spec):
        objects = [(LEADER_WORKER_SET, build_leader_worker_set(owner, spec, cache_root))]
    else:
        objects = [(DEPLOYMENT, build_deployment(owner, spec, cache_root))]
    objects += [(SERVICE, build_service(owner, leaders_only=spans_pods(spec))), (PDB, build_pdb(owner, spec))]
    if spec.autoscaling is not None:
        objects.append((SCALED_OBJECT, build_scaled_object(owner, spec, thresholds)))
    if lora_enabled(spec):
        objects.append((CONFIG_MAP, build_adapters_config_map(owner, spec)))
    routing = spec.routing
    if routing is not None and routing.endpointPicker is not None:
        objects.append((INFERENCE_POOL, build_inference_pool(owner, routing.endpointPicker, spans_pods(spec))))
        if routing.route is not None:
            objects.append((HTTP_ROUTE, build_http_route(owner, spec, routing.route)))
    if routing is not None and routing.router is not None:
        objects += build_router_objects(owner, spec, cache_root)
    return objects


def dropped_objects(owner: Owner, desired: list[tuple[Kind, dict[str, Any]]]) -> list[tuple[Kind, str]]:
    """The optional objects, by kind and name, that are not among the desired ones, in the order they go."""
    wanted = {(kind, obj["metadata"]["name"]) for kind, obj in desired}
    named = [(kind, owner.name + suffix) for kind, suffix in OPTIONAL_OBJECTS]
    return [item for item in named if item not in wanted]


def reconcile(kube: KubeClient, body: dict[str, Any], cache_root: str = DEFAULT_CACHE_ROOT) -> ReconcileResult:
    owner = Owner.from_body(body)
    previous = (body.get("status") or {}).get("conditions") or []
    changes: list[str] = []
    problem: Problem | None = None
    try:
        spec = InferenceServiceSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:  # the CRD schema should have stopped this
        problem = Problem("InvalidSpec", str(exc).splitlines()[0])
        return ReconcileResult(compute_status(owner, None, [], problem, previous, now()), problem)
    thresholds = None
    if spec.autoscaling is not None and (objectives := spec.autoscaling.objectives) is not None:
        try:  # without them the ScaledObject scales on the queue alone, and the status says why
            config_map = kube.get(CONFIG_MAP, owner.namespace, objectives.profileConfigMap)
            thresholds = thresholds_from_config_map(config_map, objectives)
        except ApiException as exc:
            problem = failure(CONFIG_MAP, owner, exc)
        except ValueError as exc:
            problem = Problem("ObjectivesUnavailable", str(exc))
    objects = desired_objects(owner, spec, cache_root, thresholds)
    for kind, name in dropped_objects(owner, objects):
        try:
            if _remove(kube, kind, owner, name):
                changes.append(f"deleted {kind.kind} {name}")
        except ApiException as exc:
            problem = problem or failure(kind, owner, exc)
    applied: dict[tuple[Kind, str], dict[str, Any]] = {}
    for kind, desired in objects:
        name = desired["metadata"]["name"]
        try:
            change, applied[kind, name] = apply(kube, kind, desired, owner)
        except (NotOwned, KindNotInstalled, ApiException) as exc:
            problem = problem or failure(kind, owner, exc)
        else:
            if change:
                changes.append(f"{change} {kind.kind} {name}")
    routing = routing_problem(
        owner,
        spec.routing and spec.routing.route,
        applied.get((INFERENCE_POOL, owner.name)),
        applied.get((HTTP_ROUTE, owner.name)),
    )
    cache = None
    if spec.model.cacheRef is not None:  # its copies decide where the pods may run
        name, autoscaling = spec.model.cacheRef.name, spec.autoscaling
        live = kube.get(MODEL_CACHE, owner.namespace, name)
        cache, waiting = service_cache(name, live, autoscaling.maxReplicas if autoscaling is not None else None)
        problem = problem or waiting
    status = _serving_status(kube, owner, spec, applied, problem, previous, routing)
    if cache is not None:
        status["modelCache"] = cache
    if thresholds is not None:
        status["autoscaling"] = thresholds.as_status()
    if spec.routing is not None and spec.routing.router is not None:
        live_router = applied.get((DEPLOYMENT, router_name(owner)))
        status["conditions"].append(router_condition(live_router, owner.generation, previous, now()))
        status["routerUrl"] = router_url(owner)
    return ReconcileResult(status, problem, changes)


def _serving_status(
    kube: KubeClient,
    owner: Owner,
    spec: InferenceServiceSpec,
    applied: dict[tuple[Kind, str], dict[str, Any]],
    problem: Problem | None,
    previous: list[dict[str, Any]],
    routing: Problem | None,
) -> dict[str, Any]:
    """The pods' part of the status: of the one Deployment (or LeaderWorkerSet, its replicas the
    groups), or of each role's."""
    owners = [owner] if spec.disaggregation is None else [owner.as_role(role) for role in ROLES]
    pods_kind = LEADER_WORKER_SET if spans_pods(spec) else DEPLOYMENT  # their status has the same fields
    live = {o.role: applied.get((pods_kind, o.object_name)) for o in owners}
    pods = {o.role: kube.list(POD, o.namespace, selector_string(o)) if live[o.role] is not None else [] for o in owners}
    if spec.disaggregation is not None:
        return disaggregated_status(owner, spec, live, pods, problem, previous, now(), routing)
    min_ready = max(1, spec.autoscaling.minReplicas) if spec.autoscaling is not None else None
    return compute_status(owner, live[None], pods[None], problem, previous, now(), min_ready, routing)


def failure(kind: Kind, owner: Owner, exc: NotOwned | KindNotInstalled | ApiException) -> Problem:
    """The problem an API failure on one kind makes; each is retried with growing delays."""
    if isinstance(exc, NotOwned):
        return Problem("ResourceConflict", str(exc), retryable=True)
    if isinstance(exc, KindNotInstalled):
        reason, need = ADD_ON_KINDS.get(kind, ("KindNotInstalled", f"the service needs {kind.kind}"))
        message = f"{need}: the {kind.kind} kind ({kind.api_version}) is not served by this cluster"
        return Problem(reason, message, retryable=True)
    detail = _api_message(exc.body)
    return Problem("APIError", f"{kind.kind} {owner.name}: {exc.status} {exc.reason}{detail}", retryable=True)


def _api_message(body: Any) -> str:
    """The API server's own explanation (a 422 names the field it refused), if it sent one."""
    try:
        message = json.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        return ""
    return f": {message}" if message else ""


class NotOwned(Exception):
    """An object of the wanted name exists but belongs to someone else; we never take it over."""


def apply(kube: KubeClient, kind: Kind, desired: dict[str, Any], owner: Owner) -> tuple[str | None, dict[str, Any]]:
    """Creates or restores one object; returns what it did (None when it was already right)
    and the object as the API server now holds it."""
    desired = with_last_applied(desired)
    meta = desired["metadata"]
    live = kube.get(kind, meta["namespace"], meta["name"])
    if live is None:
        try:
            return "created", kube.create(kind, desired)
        except ApiException as exc:
            if exc.status != 409:
                raise
            live = kube.get(kind, meta["namespace"], meta["name"])  # created meanwhile: check it instead
    if live is None or not _owned(live, owner):
        raise NotOwned(
            f"{kind.kind} {meta['namespace']}/{meta['name']} exists and is not owned by "
            f"InferenceService {owner.name}; delete or rename it"
        )
    if differences(desired, live):
        patch = merge_patch(desired, live, last_applied(live))
        return "updated", kube.patch(kind, meta["namespace"], meta["name"], patch)
    return None, live


def _remove(kube: KubeClient, kind: Kind, owner: Owner, name: str) -> bool:
    try:
        live = kube.get(kind, owner.namespace, name)
    except ApiException:
        return False
    if live is None or not _owned(live, owner):
        return False
    kube.delete(kind, owner.namespace, name)
    return True


def _owned(obj: dict[str, Any], owner: Owner) -> bool:
    return any(ref.get("uid") == owner.uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])
