"""The operator's API permissions: one table that the Helm chart's RBAC and its tests use,
and that matches the calls in kube.py and handlers.py."""

from __future__ import annotations

# (apiGroup, resources, verbs)
RULES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("argosy.dev", ("inferenceservices",), ("get", "list", "watch", "patch")),
    ("argosy.dev", ("inferenceservices/status",), ("patch",)),
    ("apps", ("deployments",), ("get", "list", "watch", "create", "patch")),
    ("", ("services",), ("get", "list", "watch", "create", "patch")),
    ("policy", ("poddisruptionbudgets",), ("get", "list", "watch", "create", "patch")),
    ("keda.sh", ("scaledobjects",), ("get", "list", "watch", "create", "patch", "delete")),
    ("inference.networking.k8s.io", ("inferencepools",), ("get", "list", "watch", "create", "patch", "delete")),
    ("gateway.networking.k8s.io", ("httproutes",), ("get", "list", "watch", "create", "patch", "delete")),
    ("", ("pods",), ("list", "watch")),
    ("", ("events",), ("create",)),
]

# Not a call: owned objects carry blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement
# admission plugin (OpenShift, hardened clusters) allows only to who may update the owner's finalizers.
ADMISSION_RULES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("argosy.dev", ("inferenceservices/finalizers",), ("update",)),
]

# kopf's peering (several operator replicas, one active) and its resource discovery.
PEERING_RULES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("kopf.dev", ("kopfpeerings",), ("get", "list", "watch", "patch")),
]
CLUSTER_RULES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("apiextensions.k8s.io", ("customresourcedefinitions",), ("get", "list", "watch")),
    ("", ("namespaces",), ("get", "list", "watch")),
    ("kopf.dev", ("clusterkopfpeerings",), ("get", "list", "watch", "patch")),
]
