"""Names, labels, selectors and owner references shared by every object the operator builds."""

from __future__ import annotations

from typing import Any

from argosy.operator.kube import INFERENCE_SERVICE
from argosy.operator.spec import SERVER_PORT, Owner

MANAGED_BY = "argosy-operator"
OWNER_LABEL = "argosy.dev/inferenceservice"


def selector_labels(owner: Owner) -> dict[str, str]:
    """The pod selector: stable for the life of the Deployment (selectors are immutable)."""
    return {"app.kubernetes.io/name": "argosy", "app.kubernetes.io/instance": owner.name}


def labels(owner: Owner) -> dict[str, str]:
    return {**selector_labels(owner), "app.kubernetes.io/managed-by": MANAGED_BY, OWNER_LABEL: owner.name}


def selector_string(owner: Owner) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(owner).items())


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": INFERENCE_SERVICE.api_version,
        "kind": INFERENCE_SERVICE.kind,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(owner: Owner) -> dict[str, Any]:
    return {
        "name": owner.name,
        "namespace": owner.namespace,
        "labels": labels(owner),
        "ownerReferences": [owner_reference(owner)],
    }


def service_url(owner: Owner) -> str:
    return f"http://{owner.name}.{owner.namespace}.svc:{SERVER_PORT}/v1"
