"""The Kubernetes kinds the operator reads and writes, each named once: its group, version,
plural and kind, from which manifests take their apiVersion and the client its paths."""

from __future__ import annotations

from dataclasses import dataclass

GROUP, VERSION = "argosy.dev", "v1alpha1"  # the API group of Argosy's own kinds


@dataclass(frozen=True)
class Kind:
    group: str  # "" for the core API
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> tuple[str, ...]:
        """The kind as kopf names a resource: (group, version, plural), or (version, plural)."""
        return (self.group, self.version, self.plural) if self.group else (self.version, self.plural)

    @property
    def owner_label(self) -> str:
        """For one of Argosy's kinds: the label naming, on every object built for one of its
        objects, the object it belongs to."""
        return f"{self.group}/{self.kind.lower()}"

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        """The object's (or, without a name, the collection's) path; namespace None: cluster-scoped,
        or, for a namespaced kind, every namespace's."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}" if namespace else f"{base}/{self.plural}"
        return path + (f"/{name}" if name else "") + (f"/{subresource}" if subresource else "")


DEPLOYMENT = Kind("apps", "v1", "deployments", "Deployment")
LEADER_WORKER_SET = Kind("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet")
SERVICE = Kind("", "v1", "services", "Service")
CONFIG_MAP = Kind("", "v1", "configmaps", "ConfigMap")
PDB = Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
SCALED_OBJECT = Kind("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject")
INFERENCE_POOL = Kind("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool")
HTTP_ROUTE = Kind("gateway.networking.k8s.io", "v1", "httproutes", "HTTPRoute")
GATEWAY = Kind("gateway.networking.k8s.io", "v1", "gateways", "Gateway")
POD = Kind("", "v1", "pods", "Pod")
SERVICE_ACCOUNT = Kind("", "v1", "serviceaccounts", "ServiceAccount")
ROLE = Kind("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLE_BINDING = Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
INFERENCE_SERVICE = Kind(GROUP, VERSION, "inferenceservices", "InferenceService")
MODEL_CACHE = Kind(GROUP, VERSION, "modelcaches", "ModelCache")
NODE = Kind("", "v1", "nodes", "Node")  # cluster-scoped: its path takes no namespace
SECRET = Kind("", "v1", "secrets", "Secret")
# What the operator creates for an InferenceService (pods through the Deployment or the
# LeaderWorkerSet), and so watches.
OWNED_KINDS = (
    DEPLOYMENT,
    LEADER_WORKER_SET,
    SERVICE,
    PDB,
    POD,
    CONFIG_MAP,
    SCALED_OBJECT,
    INFERENCE_POOL,
    HTTP_ROUTE,
    SERVICE_ACCOUNT,
    ROLE,
    ROLE_BINDING,
)
