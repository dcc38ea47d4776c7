"""Names, labels, selectors and owner references shared by every object the operator builds,
and the head every built manifest starts with."""

from __future__ import annotations

from typing import Any

from argosy.operator.kinds import Kind
from argosy.operator.owner import Owner
from argosy.server.interface import SERVER_PORT

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "argosy-operator"
# An engine profile's ConfigMap (made from `argosy profile`'s file): the operator watches those too, so that
# a new profile re-derives the thresholds of the services whose objectives name it.
PROFILE_MANAGED_BY = "argosy-profile"


ROLE_LABEL = "argosy.dev/role"  # prefill or decode, under spec.disaggregation
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"  # a LeaderWorkerSet's pods: "0" on leaders


def selector_labels(owner: Owner) -> dict[str, str]:
    """The pod selector: stable for the life of the Deployment (selectors are immutable). A role's pods
    carry their role too; the service's selector (no role) takes both."""
    base = {"app.kubernetes.io/name": "argosy", "app.kubernetes.io/instance": owner.name}
    return base if owner.role is None else {**base, ROLE_LABEL: owner.role}


def serving_labels(owner: Owner, leaders_only: bool = False) -> dict[str, str]:
    """The pods that answer the API: all of them, or, when they are LeaderWorkerSet groups, the leaders."""
    return selector_labels(owner) | ({WORKER_INDEX_LABEL: "0"} if leaders_only else {})


def labels(owner: Owner) -> dict[str, str]:
    return {**selector_labels(owner), MANAGED_BY_LABEL: MANAGED_BY, owner.kind.owner_label: owner.name}


def selector_string(owner: Owner) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(owner).items())


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": owner.kind.api_version,
        "kind": owner.kind.kind,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def router_selector_labels(owner: Owner) -> dict[str, str]:
    """The router's pods: never selected by the server's selector (its Service, PDB and pool)."""
    return {"app.kubernetes.io/name": "argosy-router", "app.kubernetes.io/instance": owner.name}


def router_labels(owner: Owner) -> dict[str, str]:
    return {**labels(owner), **router_selector_labels(owner), "app.kubernetes.io/component": "router"}


def metadata(owner: Owner, name: str | None = None, object_labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "name": name or owner.object_name,
        "namespace": owner.namespace,
        "labels": object_labels or labels(owner),
        "ownerReferences": [owner_reference(owner)],
    }


def manifest(kind: Kind, owner: Owner, spec: dict[str, Any]) -> dict[str, Any]:
    """An object of `kind` built for `owner`, named after it (and its role)."""
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": metadata(owner), "spec": spec}


def service_url(owner: Owner) -> str:
    return f"http://{owner.name}.{owner.namespace}.svc:{SERVER_PORT}/v1"
