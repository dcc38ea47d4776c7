"""InferenceService -> the LeaderWorkerSet of a model larger than one pod: each replica a group of
`size` pods created, restarted and rolled out as one (LWS, kubernetes-sigs/lws). The leader runs
`argosy serve` as node 0 of the model's ranks and serves the API; each worker runs
`argosy serve --headless` as node LWS_WORKER_INDEX. They find each other at the leader's address,
which LWS gives every pod of a group as LWS_LEADER_ADDRESS (the container's arguments name the
variables and the kubelet expands them). A pod that fails restarts its whole group
(RecreateGroupOnPodRestart): the ranks of a model cannot go on without one of theirs.

Pods per group: the engine's ranks (tensor x pipeline) over the ranks of one pod (its nvidia.com/gpu
limit, or tensorParallelSize without one): with one stage's tensor-parallel ranks in each pod,
the stages span the pods."""

from __future__ import annotations

import copy
from typing import Any

from argosy.operator.deployment import pod_template
from argosy.operator.kinds import LEADER_WORKER_SET
from argosy.operator.labels import manifest
from argosy.operator.model_cache.nodes import DEFAULT_CACHE_ROOT
from argosy.operator.owner import Owner
from argosy.operator.spec import InferenceServiceSpec

GPU = "nvidia.com/gpu"
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
WORKER_INDEX = "$(LWS_WORKER_INDEX)"
MASTER_PORT = 29500  # the leader's rendezvous; the next port carries the calls to the workers


def ranks_per_pod(spec: InferenceServiceSpec) -> int:
    limit = (spec.resources.limits or {}).get(GPU)
    return int(str(limit)) if limit is not None else spec.engine.tensorParallelSize


def pods_per_group(spec: InferenceServiceSpec) -> int:
    return spec.engine.tensorParallelSize * spec.engine.pipelineParallelSize // ranks_per_pod(spec)


def spans_pods(spec: InferenceServiceSpec) -> bool:
    return pods_per_group(spec) > 1


def build_leader_worker_set(
    owner: Owner, spec: InferenceServiceSpec, cache_root: str = DEFAULT_CACHE_ROOT
) -> dict[str, Any]:
    size = pods_per_group(spec)
    nodes = ["--nnodes", str(size), "--master-addr", LEADER_ADDRESS, "--master-port", str(MASTER_PORT)]
    leader = pod_template(owner, spec, cache_root)
    worker = copy.deepcopy(leader)
    server = leader["spec"]["containers"][0]
    server["args"] += [*nodes, "--node-rank", "0"]
    server["ports"] += [
        {"name": "rendezvous", "containerPort": MASTER_PORT, "protocol": "TCP"},
        {"name": "workers", "containerPort": MASTER_PORT + 1, "protocol": "TCP"},
    ]
    worker["metadata"]["annotations"] = {  # no API and no /metrics on a worker
        k: v for k, v in worker["metadata"]["annotations"].items() if not k.startswith("prometheus.io/")
    }
    node = worker["spec"]["containers"][0]
    node["args"] += [*nodes, "--node-rank", WORKER_INDEX, "--headless"]
    node["ports"] = []
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):  # its HTTP server is the leader's
        node.pop(probe)
    lws_spec: dict[str, Any] = {
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": {
            "type": "RollingUpdate",
            "rollingUpdateConfiguration": {
                "maxSurge": spec.rollout.maxSurge,
                "maxUnavailable": spec.rollout.maxUnavailable,
            },
        },
        "leaderWorkerTemplate": {
            "size": size,
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": leader,
            "workerTemplate": worker,
        },
    }
    if spec.autoscaling is None:  # with autoscaling, the group count belongs to KEDA's HPA
        lws_spec["replicas"] = spec.replicas
    return manifest(LEADER_WORKER_SET, owner, lws_spec)
