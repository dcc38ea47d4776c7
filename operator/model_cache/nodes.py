"""Which nodes a ModelCache selects, where a node keeps its copy, and the label that says a
node's copy is ready: pure functions that the operator and the agents share."""

from __future__ import annotations

import hashlib
from typing import Any

from argosy.operator.kinds import GROUP
from argosy.operator.kube_types import Toleration
from argosy.operator.model_cache.spec import ModelCacheSpec

DEFAULT_CACHE_ROOT = "/var/lib/argosy/model-cache"
READY = "ready"  # the label's value on a node whose copy is ready
LABEL_PREFIX = f"modelcache.{GROUP}"
AGENT_ADDRESS = f"{GROUP}/model-cache-agent"  # the node annotation where its agent serves copies to peers
_REPELLING = ("NoSchedule", "NoExecute")  # taints that keep a pod, and so a copy, off a node


def copy_folder(root: str, namespace: str, name: str) -> str:
    """Where a node keeps the copy of a ModelCache: the same path on every node."""
    return f"{root.rstrip('/')}/{namespace}/{name}"


def ready_label(namespace: str, name: str) -> str:
    """The label a node carries, with the value "ready", while its copy of the ModelCache is
    Ready. A label name is at most 63 characters: a longer namespace and name are shortened,
    with a digest of the whole to keep them apart."""
    key = f"{namespace}.{name}"
    if len(key) > 63:
        digest = hashlib.sha256(key.encode()).hexdigest()[:10]
        key = f"{key[:52].rstrip('.-_')}-{digest}"
    return f"{LABEL_PREFIX}/{key}"


def tolerates(toleration: Toleration, taint: dict[str, Any]) -> bool:
    """Kubernetes' matching of a toleration and a taint."""
    if toleration.effect and toleration.effect != taint.get("effect"):
        return False
    if toleration.operator == "Exists":
        return toleration.key in (None, "", taint.get("key"))
    return toleration.key == taint.get("key") and (toleration.value or "") == (taint.get("value") or "")


def selects(spec: ModelCacheSpec, node: dict[str, Any]) -> bool:
    """Whether the ModelCache wants a copy on the node: its labels match the nodeSelector and
    every taint that would keep a pod off the node is tolerated."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(key) != value for key, value in spec.nodeSelector.items()):
        return False
    taints = (node.get("spec") or {}).get("taints") or []
    return all(
        any(tolerates(t, taint) for t in spec.tolerations) for taint in taints if taint.get("effect") in _REPELLING
    )
