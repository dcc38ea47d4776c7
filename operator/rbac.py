"""The operator's API permissions: one table that the Helm chart's RBAC and its tests use,
and that matches the calls in kube.py and handlers.py. Each of Argosy's own kinds (crd.RESOURCES)
is read and watched and its status written; the InferenceService is also patched (kopf keeps
its progress in annotations). The model-cache agent's permissions are agent_rbac.py's."""

from __future__ import annotations

from argosy.operator.crd import RESOURCES
from argosy.operator.kinds import (
    CONFIG_MAP,
    DEPLOYMENT,
    HTTP_ROUTE,
    INFERENCE_POOL,
    INFERENCE_SERVICE,
    LEADER_WORKER_SET,
    NODE,
    PDB,
    POD,
    ROLE,
    ROLE_BINDING,
    SCALED_OBJECT,
    SERVICE,
    SERVICE_ACCOUNT,
)

Rule = tuple[str, tuple[str, ...], tuple[str, ...]]  # (apiGroup, resources, verbs)

RULES: list[Rule] = [
    *((r.kind.group, (r.kind.plural,), ("get", "list", "watch")) for r in RESOURCES),
    (INFERENCE_SERVICE.group, (INFERENCE_SERVICE.plural,), ("patch",)),
    *((r.kind.group, (f"{r.kind.plural}/status",), ("patch",)) for r in RESOURCES),
    # What the operator builds: created, and patched back when it drifts; optional kinds also deleted.
    (PDB.group, (PDB.plural,), ("get", "list", "watch", "create", "patch")),
    *(
        (k.group, (k.plural,), ("get", "list", "watch", "create", "patch", "delete"))
        for k in (DEPLOYMENT, LEADER_WORKER_SET, SERVICE, CONFIG_MAP, SCALED_OBJECT, INFERENCE_POOL, HTTP_ROUTE)
    ),
    # The router's identity, and its Role and binding (ROUTER_RULES).
    *(
        (k.group, (k.plural,), ("get", "list", "watch", "create", "patch", "delete"))
        for k in (SERVICE_ACCOUNT, ROLE, ROLE_BINDING)
    ),
    (POD.group, (POD.plural,), ("list", "watch")),
    ("", ("events",), ("create",)),
]

# What the router's Role grants it (it watches the pods); not a call of the operator's, but held by it,
# since RBAC lets no one grant what it does not hold.
ROUTER_RULES: list[Rule] = [(POD.group, (POD.plural,), ("get", "list", "watch"))]

# Cluster-scoped kinds the operator reads: the nodes a ModelCache selects.
NODE_RULES: list[Rule] = [(NODE.group, (NODE.plural,), ("list",))]

# Not a call: owned objects carry blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement
# admission plugin (OpenShift, hardened clusters) allows only to who may update the owner's finalizers.
ADMISSION_RULES: list[Rule] = [(INFERENCE_SERVICE.group, (f"{INFERENCE_SERVICE.plural}/finalizers",), ("update",))]

# kopf's peering (several operator replicas, one active) and its resource discovery.
PEERING_RULES: list[Rule] = [
    ("kopf.dev", ("kopfpeerings",), ("get", "list", "watch", "patch")),
]
CLUSTER_RULES: list[Rule] = [
    ("apiextensions.k8s.io", ("customresourcedefinitions",), ("get", "list", "watch")),
    ("", ("namespaces",), ("get", "list", "watch")),
    ("kopf.dev", ("clusterkopfpeerings",), ("get", "list", "watch", "patch")),
]
