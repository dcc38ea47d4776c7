"""InferenceService -> its Service and its PodDisruptionBudget."""

from __future__ import annotations

from typing import Any

from argosy.operator.labels import metadata, selector_labels
from argosy.operator.spec import SERVER_PORT, InferenceServiceSpec, Owner


def build_service(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner),
            "ports": [{"name": "http", "port": SERVER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_pdb(owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(owner),
        "spec": {
            "selector": {"matchLabels": selector_labels(owner)},
            "maxUnavailable": spec.disruptionBudget.maxUnavailable,
        },
    }
