"""InferenceService -> the Deployment of `argosy serve` pods (and the pod template that a
LeaderWorkerSet's leaders and workers start from, leader_worker_set.py)."""

from __future__ import annotations

import copy
import math
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity
from pydantic import BaseModel

from argosy.operator.adapters_config import ADAPTERS_MOUNT, adapters_file_path, lora_enabled
from argosy.operator.kinds import DEPLOYMENT
from argosy.operator.labels import labels, manifest, selector_labels
from argosy.operator.model_cache.nodes import DEFAULT_CACHE_ROOT, READY, copy_folder, ready_label
from argosy.operator.owner import Owner
from argosy.operator.spec import (
    MODEL_MOUNT,
    InferenceServiceSpec,
    KVEventsSpec,
    KVTransferSpec,
    LoRASpec,
    SpeculativeSpec,
    engine_flags,
    serve_flags,
)
from argosy.server.interface import API_KEY_ENV, CACHE_ENV, HEALTH_PATH, LIVE_PATH, METRICS_PATH, SERVER_PORT

RUN_AS_USER = 10001
PRE_STOP_SLEEP_SECONDS = 5  # lets endpoint removal reach the proxies before the drain starts
STARTUP_PERIOD_SECONDS = 10
# A hung engine is the server's own to catch: it exits within engineStepTimeoutSeconds and the
# kubelet restarts it. Liveness catches what the server cannot: an API process that stops
# answering is restarted within LIVENESS_PERIOD_SECONDS * LIVENESS_FAILURES.
LIVENESS_PERIOD_SECONDS = 10
LIVENESS_FAILURES = 3
PROGRESS_MARGIN_SECONDS = 600


def server_args(spec: InferenceServiceSpec) -> list[str]:
    """The `argosy serve` command line for this spec: every engine setting that has a flag."""
    args = [
        "serve",
        "--model",
        f"{MODEL_MOUNT}/{spec.model.path}",
        "--served-model-name",
        spec.model.name,
        "--host",
        "0.0.0.0",
        "--port",
        str(SERVER_PORT),
        "--log-format",
        "json",
    ]
    settings = [(spec.engine, engine_flags())]
    if lora_enabled(spec):
        args += ["--enable-lora", "--lora-config-file", adapters_file_path()]
        settings.append((spec.lora or LoRASpec(), serve_flags(LoRASpec)))
    for section, flags in settings:
        for name, flag in flags.items():
            value = getattr(section, name)
            if value is None:
                continue
            if isinstance(value, bool):
                args.append(flag if value else flag.replace("--", "--no-", 1))
            elif isinstance(value, list):  # a repeatable flag
                args += [arg for item in value for arg in (flag, str(item))]
            elif isinstance(value, SpeculativeSpec | KVEventsSpec | KVTransferSpec):
                args += [flag, value.flag_value()]
            else:
                args += [flag, str(value)]
    if spec.engine.kvEventsConfig is None and spec.kv_events is not None:  # turned on for a kv_aware router
        args += [engine_flags()["kvEventsConfig"], spec.kv_events.flag_value()]
    return args


def build_deployment(owner: Owner, spec: InferenceServiceSpec, cache_root: str = DEFAULT_CACHE_ROOT) -> dict[str, Any]:
    """`cache_root`: where the nodes' model-cache agents keep their copies (with spec.model.cacheRef)."""
    deployment_spec: dict[str, Any] = {
        "selector": {"matchLabels": selector_labels(owner)},
        "revisionHistoryLimit": 3,
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": spec.rollout.maxSurge, "maxUnavailable": spec.rollout.maxUnavailable},
        },
        # A rollout may take as long as a model load; only then is it reported as stuck.
        "progressDeadlineSeconds": spec.startupTimeoutSeconds + PROGRESS_MARGIN_SECONDS,
        "template": pod_template(owner, spec, cache_root),
    }
    if spec.autoscaling is None:  # with autoscaling, the replica count belongs to KEDA's HPA
        deployment_spec["replicas"] = spec.replicas
    return manifest(DEPLOYMENT, owner, deployment_spec)


def pod_template(owner: Owner, spec: InferenceServiceSpec, cache_root: str = DEFAULT_CACHE_ROOT) -> dict[str, Any]:
    """The pods of `argosy serve`: a Deployment's, or a LeaderWorkerSet's leader and workers'."""
    return {
        "metadata": {"labels": labels(owner), "annotations": _pod_annotations(spec)},
        "spec": _pod_spec(owner, spec, cache_root),
    }


def _pod_annotations(spec: InferenceServiceSpec) -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(SERVER_PORT),
        "prometheus.io/path": METRICS_PATH,
        **spec.podAnnotations,
    }


def _pod_spec(owner: Owner, spec: InferenceServiceSpec, cache_root: str) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "containers": [_container(spec)],
        "volumes": [
            _model_volume(owner, spec, cache_root),
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(spec)}},
            {"name": "tmp", "emptyDir": {}},
        ],
        # The server drains for up to shutdownTimeoutSeconds after the preStop pause.
        "terminationGracePeriodSeconds": spec.engine.shutdownTimeoutSeconds + PRE_STOP_SLEEP_SECONDS + 15,
        "securityContext": pod_security(),
        "enableServiceLinks": False,
    }
    if lora_enabled(spec):
        pod["volumes"].append({"name": "adapters", "configMap": {"name": owner.name}})
    node_selector = {**spec.model.nodeSelector, **spec.nodeSelector}
    optional = {
        "nodeSelector": node_selector,
        "tolerations": dump_items(spec.tolerations),
        "affinity": _with_cache(spec.affinity, owner, spec),
        "imagePullSecrets": dump_items(spec.imagePullSecrets),
        "serviceAccountName": spec.serviceAccountName,
        "priorityClassName": spec.priorityClassName,
    }
    pod.update({k: v for k, v in optional.items() if v})
    return pod


def pod_security() -> dict[str, Any]:
    """Non-root with the image's own uid, the runtime's default seccomp profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _container(spec: InferenceServiceSpec) -> dict[str, Any]:
    env = [
        {"name": "HOME", "value": "/tmp"},
        {"name": CACHE_ENV, "value": "/tmp/argosy"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if spec.engine.hashSeed is not None:
        env.append({"name": "PYTHONHASHSEED", "value": spec.engine.hashSeed})
    if spec.kv_events is not None or spec.engine.kvTransferConfig is not None:  # $(POD_IP) in their flags
        env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    if spec.engine.apiKeySecretRef is not None:
        ref = spec.engine.apiKeySecretRef
        env.append({"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    health = {"httpGet": {"path": HEALTH_PATH, "port": "http"}}
    container: dict[str, Any] = {
        "name": "server",
        "image": spec.image,
        "imagePullPolicy": spec.imagePullPolicy,
        "command": ["argosy"],
        "args": server_args(spec),
        "ports": [{"name": "http", "containerPort": SERVER_PORT, "protocol": "TCP"}, *_kv_ports(spec)],
        "env": env,
        "volumeMounts": [
            {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True},
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
            # Not a subPath: only a whole-volume mount sees the kubelet's updates of the ConfigMap.
            *([{"name": "adapters", "mountPath": ADAPTERS_MOUNT, "readOnly": True}] if lora_enabled(spec) else []),
        ],
        "startupProbe": {
            **health,
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "timeoutSeconds": 5,
            "failureThreshold": math.ceil(spec.startupTimeoutSeconds / STARTUP_PERIOD_SECONDS),
        },
        "readinessProbe": {**health, "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 2},
        # /live fails only when the server cannot recover by itself (its engine dead or hung),
        # never while it drains or runs a long step: /health is 503 while draining.
        "livenessProbe": {
            "httpGet": {"path": LIVE_PATH, "port": "http"},
            "periodSeconds": LIVENESS_PERIOD_SECONDS,
            "timeoutSeconds": 5,
            "failureThreshold": LIVENESS_FAILURES,
        },
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SLEEP_SECONDS)]}}},
        "securityContext": container_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = with_swap_space(spec.resources.model_dump(exclude_defaults=True), spec.engine.swapSpace)
    if resources:
        container["resources"] = resources
    return container


def _kv_ports(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The KV events' ports (unless they connect out), and the KV transfer's side channel."""
    events, transfer, ports = spec.kv_events, spec.engine.kvTransferConfig, []
    if events is not None and events.connect is None:
        ports.append({"name": "kv-events", "containerPort": events.port, "protocol": "TCP"})
        if events.replayPort is not None:
            ports.append({"name": "kv-replay", "containerPort": events.replayPort, "protocol": "TCP"})
    if transfer is not None:
        ports.append({"name": "kv-transfer", "containerPort": transfer.port, "protocol": "TCP"})
    return ports


SHM_PER_RANK = 1 << 30  # the collectives' buffers between the ranks of one pod


def shm_size(spec: InferenceServiceSpec) -> str:
    """The pod's /dev/shm: the spec's, and at least SHM_PER_RANK for each tensor-parallel rank."""
    ranks = spec.engine.tensorParallelSize
    wanted = parse_quantity(spec.shmSize)
    if ranks == 1 or wanted >= ranks * SHM_PER_RANK:
        return spec.shmSize
    return f"{ranks * SHM_PER_RANK >> 20}Mi"


def with_swap_space(resources: dict[str, Any], swap_gib: float) -> dict[str, Any]:
    """The container's resources with the host KV tier's memory added: to the memory request
    (which is the tier alone when none was given), and to the memory limit when there is one,
    so that the tier's pinned memory never pushes the server past it."""
    if not swap_gib:
        return resources
    resources = {kind: dict(values) for kind, values in resources.items()}
    for kind in ("requests", "limits"):
        current = resources.get(kind, {}).get("memory")
        if kind == "limits" and current is None:
            continue
        total = (0 if current is None else parse_quantity(current)) + Decimal(str(swap_gib)) * (1 << 30)
        resources.setdefault(kind, {})["memory"] = f"{math.ceil(total / (1 << 20))}Mi"
    return resources


def dump_items(items: list[BaseModel]) -> list[dict[str, Any]]:
    """Typed list items as the pod takes them, without the fields left out."""
    return [item.model_dump(exclude_none=True) for item in items]


def _model_volume(owner: Owner, spec: InferenceServiceSpec, cache_root: str) -> dict[str, Any]:
    if spec.model.cacheRef is not None:
        path = copy_folder(cache_root, owner.namespace, spec.model.cacheRef.name)
        return {"name": "model", "hostPath": {"path": path, "type": "Directory"}}
    if spec.model.persistentVolumeClaim is not None:
        return {
            "name": "model",
            "persistentVolumeClaim": {"claimName": spec.model.persistentVolumeClaim.claimName, "readOnly": True},
        }
    # type Directory: a node without the NVMe folder fails the mount visibly instead of
    # silently creating an empty folder.
    return {"name": "model", "hostPath": {"path": spec.model.hostPath, "type": "Directory"}}


def _with_cache(affinity: dict[str, Any] | None, owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    """The spec's affinity, with spec.model.cacheRef: also requiring a node whose copy of the
    ModelCache is ready (added to each of the spec's required terms, which are alternatives)."""
    if spec.model.cacheRef is None:
        return affinity
    ready = {"key": ready_label(owner.namespace, spec.model.cacheRef.name), "operator": "In", "values": [READY]}
    affinity = copy.deepcopy(affinity or {})
    required = affinity.setdefault("nodeAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", []) or [{}]
    for term in terms:
        term["matchExpressions"] = [*term.get("matchExpressions", []), ready]
    required["nodeSelectorTerms"] = terms
    return affinity
