"""InferenceService -> its Service and its PodDisruptionBudget."""

from __future__ import annotations

from typing import Any

from argosy.operator.kinds import PDB, SERVICE
from argosy.operator.labels import manifest, selector_labels, serving_labels
from argosy.operator.owner import Owner
from argosy.operator.spec import InferenceServiceSpec
from argosy.server.interface import SERVER_PORT


def build_service(owner: Owner, leaders_only: bool = False) -> dict[str, Any]:
    """`leaders_only`: the pods are LeaderWorkerSet groups, whose leaders alone serve the API."""
    return manifest(
        SERVICE,
        owner,
        {
            "type": "ClusterIP",
            "selector": serving_labels(owner, leaders_only),
            "ports": [{"name": "http", "port": SERVER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    )


def build_pdb(owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    return manifest(
        PDB,
        owner,
        {"selector": {"matchLabels": selector_labels(owner)}, "maxUnavailable": spec.disruptionBudget.maxUnavailable},
    )
