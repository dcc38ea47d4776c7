"""InferenceService with spec.routing.router -> the vLLM router in front of its pods: a Deployment and
a Service `<name>-router`, and the ServiceAccount, Role and RoleBinding that let it watch the pods.

The router finds the pods itself (`--service-discovery` on the server's selector), adding each as it
turns ready and dropping it as it goes; for each one it asks the pod where its KV-cache events are
(`/get_server_info`, `/kv_event_sources`) and subscribes, so nothing here lists endpoints and no
rollout follows a pod's change. With a ModelCache, the router runs on a node holding the model's
copy and tokenizes prompts itself from it (VLLM_ROUTER_TOKENIZER); otherwise it asks the pods'
/tokenize."""

from __future__ import annotations

from typing import Any

from argosy.operator.deployment import container_security, dump_items, pod_security
from argosy.operator.disaggregation import pd_router_args
from argosy.operator.kinds import DEPLOYMENT, ROLE, ROLE_BINDING, SERVICE, SERVICE_ACCOUNT, Kind
from argosy.operator.labels import metadata, router_labels, router_selector_labels, serving_labels
from argosy.operator.leader_worker_set import spans_pods
from argosy.operator.model_cache.nodes import DEFAULT_CACHE_ROOT, READY, copy_folder, ready_label
from argosy.operator.owner import Owner
from argosy.operator.rbac import ROUTER_RULES
from argosy.operator.spec import MODEL_MOUNT, InferenceServiceSpec, RouterSpec
from argosy.server.interface import SERVER_PORT

ROUTER_PORT = SERVER_PORT  # clients reach the router as they would a pod
ROUTER_METRICS_PORT = 29000  # the router's own Prometheus exporter
HEALTH_CHECK_SECONDS = 5


ROUTER_SUFFIX = "-router"


def router_name(owner: Owner) -> str:
    return owner.name + ROUTER_SUFFIX


def router_url(owner: Owner) -> str:
    """Where clients reach the model through the router (as status.url, through the Service)."""
    return f"http://{router_name(owner)}.{owner.namespace}.svc:{ROUTER_PORT}/v1"


def router_args(owner: Owner, router: RouterSpec, disaggregated: bool = False, leaders_only: bool = False) -> list[str]:
    """Disaggregated: the router's P/D mode, each role found by its own selector; `leaders_only`: the
    pods are LeaderWorkerSet groups, whose leaders alone serve."""
    selector = [f"{key}={value}" for key, value in serving_labels(owner, leaders_only).items()]
    discovery = pd_router_args(owner) if disaggregated else ["--selector", *selector]
    return [
        "--host", "0.0.0.0", "--port", str(ROUTER_PORT), "--policy", router.policy,
        "--service-discovery", *discovery,
        "--service-discovery-port", str(SERVER_PORT), "--service-discovery-namespace", owner.namespace,
        "--prometheus-host", "0.0.0.0", "--prometheus-port", str(ROUTER_METRICS_PORT),
        "--health-check-interval-secs", str(HEALTH_CHECK_SECONDS),
    ]  # fmt: skip


def build_router_objects(
    owner: Owner, spec: InferenceServiceSpec, cache_root: str = DEFAULT_CACHE_ROOT
) -> list[tuple[Kind, dict[str, Any]]]:
    router = spec.routing.router
    name, labels = router_name(owner), router_labels(owner)

    def head(kind: Kind) -> dict[str, Any]:
        return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": metadata(owner, name, labels)}

    rules = [{"apiGroups": [group], "resources": list(res), "verbs": list(verbs)} for group, res, verbs in ROUTER_RULES]
    role = {**head(ROLE), "rules": rules}
    binding = {
        **head(ROLE_BINDING),
        "roleRef": {"apiGroup": ROLE.group, "kind": ROLE.kind, "name": name},
        "subjects": [{"kind": SERVICE_ACCOUNT.kind, "name": name, "namespace": owner.namespace}],
    }
    service = {
        **head(SERVICE),
        "spec": {
            "selector": router_selector_labels(owner),
            "ports": [
                {"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": ROUTER_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }
    return [
        (SERVICE_ACCOUNT, {**head(SERVICE_ACCOUNT), "automountServiceAccountToken": True}),
        (ROLE, role),
        (ROLE_BINDING, binding),
        (DEPLOYMENT, {**head(DEPLOYMENT), "spec": _deployment_spec(owner, spec, router, cache_root)}),
        (SERVICE, service),
    ]


def _deployment_spec(owner: Owner, spec: InferenceServiceSpec, router: RouterSpec, cache_root: str) -> dict[str, Any]:
    probe = {"periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3}
    container: dict[str, Any] = {
        "name": "router",
        "image": router.image or spec.image,
        "imagePullPolicy": spec.imagePullPolicy,
        "command": ["vllm-router"],
        "args": router_args(owner, router, spec.disaggregation is not None, spans_pods(spec)),
        "ports": [
            {"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"},
        ],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, **probe},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"}, **probe},
        "securityContext": container_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    resources = router.resources.model_dump(exclude_defaults=False)
    if any(resources.values()):
        container["resources"] = {kind: values for kind, values in resources.items() if values}
    pod: dict[str, Any] = {
        "serviceAccountName": router_name(owner),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
        "securityContext": pod_security(),
        "enableServiceLinks": False,
    }
    if spec.model.cacheRef is not None:  # tokenizes from the node's copy, on a node that holds one
        cache = spec.model.cacheRef.name
        path = copy_folder(cache_root, owner.namespace, cache)
        pod["volumes"].append({"name": "model", "hostPath": {"path": path, "type": "Directory"}})
        container["volumeMounts"].append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
        container["env"].append({"name": "VLLM_ROUTER_TOKENIZER", "value": MODEL_MOUNT})
        ready = {"key": ready_label(owner.namespace, cache), "operator": "In", "values": [READY]}
        term = {"matchExpressions": [ready]}
        required = {"nodeSelectorTerms": [term]}
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
        if spec.tolerations:
            pod["tolerations"] = dump_items(spec.tolerations)
    if spec.imagePullSecrets:
        pod["imagePullSecrets"] = dump_items(spec.imagePullSecrets)
    return {
        "replicas": router.replicas,
        "selector": {"matchLabels": router_selector_labels(owner)},
        "revisionHistoryLimit": 3,
        # A new router must be ready before an old one goes: requests never find no router.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {
            "metadata": {
                "labels": router_labels(owner),
                "annotations": {
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": str(ROUTER_METRICS_PORT),
                    "prometheus.io/path": "/metrics",
                },
            },
            "spec": pod,
        },
    }
