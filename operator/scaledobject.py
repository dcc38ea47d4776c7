"""InferenceService -> the KEDA ScaledObject that scales its Deployment on the queue depth.

The first trigger sums `argosy_num_requests_waiting` over exactly this service's pods. The server
exports that gauge with a `model_name` label only; which pod a series comes from is told by
the `namespace` and `pod` labels that Prometheus attaches when it scrapes Kubernetes pods (a
PodMonitor does by default; a `kubernetes_sd_configs` pod job does with the usual relabelling
of `__meta_kubernetes_namespace` and `__meta_kubernetes_pod_name`). Deployment pods are named
`<deployment>-<template hash>-<5 characters>`, which the pod regex matches and nothing else.

With routing, a second trigger reads the requests the Endpoint Picker holds for this pool in its
flow-control queue. That gauge lives on the picker, not on the pods, so it still answers at
zero replicas: one held request activates the ScaledObject and KEDA starts the first pod, while
the picker holds the request. The picker labels the gauge with its pool's bare name
(`inference_pool`); Prometheus adds the picker pod's `namespace`, the pool's own, since a pool's
picker Service lives in the pool's namespace. llm-d's router exports the gauge under its new
name and, for now, also under the deprecated one: the query takes the new one when present.

Scaled to zero, the service is woken by its triggers and put back to sleep when all of them
read 0 for the cooldown. A busy service within its capacity has no waiting and no held request,
so with minReplicas 0 a third trigger counts the running requests: it keeps the service awake
while anything runs, and asks for no more replicas than the running batches fill
(`maxNumSeqs` each).

With latency objectives (spec.autoscaling.objectives) the thresholds come from the engine's
profile through operator/objectives.py: the output tokens per second a replica generates within
the ITL objective (the rate of the pods' generation counters over a minute), the waiting requests
it drains within the TTFT objective (unless targetWaitingRequests is set), and the KV-cache usage
of the batch that meets the ITL objective."""

from __future__ import annotations

from typing import Any

from argosy.operator.kinds import DEPLOYMENT, LEADER_WORKER_SET, SCALED_OBJECT
from argosy.operator.labels import manifest
from argosy.operator.leader_worker_set import spans_pods
from argosy.operator.objectives import Thresholds
from argosy.operator.owner import Owner
from argosy.operator.spec import InferenceServiceSpec
from argosy.server.interface import GENERATION_TOKENS_METRIC, KV_USAGE_METRIC, RUNNING_METRIC, WAITING_METRIC

HELD_METRICS = ("llm_d_epp_flow_control_queue_size", "inference_extension_flow_control_queue_size")


def pods_query(owner: Owner, metric: str, rate: str | None = None, groups: bool = False) -> str:
    """The sum of a metric over this service's pods; of its per-second rate over `rate` (a range).
    `groups`: the pods are a LeaderWorkerSet's, whose leaders (`<name>-<group>`) serve and are scraped."""
    pods = f"{owner.object_name}-[0-9]{{1,5}}" if groups else f"{owner.object_name}-[a-z0-9]{{1,10}}-[a-z0-9]{{5}}"
    series = f'{metric}{{namespace="{owner.namespace}",pod=~"{pods}"}}'
    return f"sum({series if rate is None else f'rate({series}[{rate}])'}) or vector(0)"


def waiting_requests_query(owner: Owner, groups: bool = False) -> str:
    return pods_query(owner, WAITING_METRIC, groups=groups)


def held_requests_query(owner: Owner) -> str:
    pool = f'namespace="{owner.namespace}",inference_pool="{owner.name}"'
    return " or ".join([*(f"sum({metric}{{{pool}}})" for metric in HELD_METRICS), "vector(0)"])


def build_scaled_object(
    owner: Owner, service: InferenceServiceSpec, thresholds: Thresholds | None = None
) -> dict[str, Any]:
    """`thresholds`: derived from spec.autoscaling.objectives, when it is set."""
    a = service.autoscaling
    if a is None:
        raise ValueError("only a service with autoscaling has a ScaledObject")
    waiting = a.targetWaitingRequests
    if thresholds is not None and "targetWaitingRequests" not in a.model_fields_set:
        waiting = thresholds.waiting_requests
    groups = spans_pods(service)
    target = LEADER_WORKER_SET if groups else DEPLOYMENT  # a LeaderWorkerSet scales by groups
    # trigger name -> (query, value per replica)
    triggers = {"waiting-requests": (waiting_requests_query(owner, groups), waiting)}
    if service.routing is not None and service.routing.endpointPicker is not None:
        triggers["held-requests"] = (held_requests_query(owner), waiting)
    if thresholds is not None:
        tokens = pods_query(owner, GENERATION_TOKENS_METRIC, rate="1m", groups=groups)
        triggers["output-tokens"] = (tokens, thresholds.tokens_per_second)
        triggers["kv-cache-usage"] = (pods_query(owner, KV_USAGE_METRIC, groups=groups), thresholds.kv_cache_usage)
    elif a.minReplicas == 0:
        triggers["running-requests"] = (pods_query(owner, RUNNING_METRIC, groups=groups), service.engine.maxNumSeqs)
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": target.api_version, "kind": target.kind, "name": owner.object_name},
        "minReplicaCount": a.minReplicas,
        "maxReplicaCount": a.maxReplicas,
        "pollingInterval": a.pollingIntervalSeconds,
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "behavior": {
                    # Scale down slowly: a pod's queue drains before it goes. On the queue alone, one pod a
                    # minute (a queue reads 0 whenever the fleet keeps up); with objectives the throughput
                    # trigger says what the load needs, and half the pods may go each minute.
                    "scaleDown": {
                        "stabilizationWindowSeconds": a.scaleDownStabilizationSeconds,
                        "policies": [
                            {"type": "Pods", "value": 1, "periodSeconds": 60}
                            if thresholds is None
                            else {"type": "Percent", "value": 50, "periodSeconds": 60}
                        ],
                    },
                    # Scale up at once: waiting requests are users waiting.
                    "scaleUp": {
                        "stabilizationWindowSeconds": 0,
                        "selectPolicy": "Max",
                        "policies": [
                            {"type": "Percent", "value": 100, "periodSeconds": 15},
                            {"type": "Pods", "value": 4, "periodSeconds": 15},
                        ],
                    },
                }
            }
        },
        "triggers": [
            {
                "type": "prometheus",
                "name": name,
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": a.prometheusAddress,
                    "query": query,
                    "threshold": _number(threshold),
                    # Active above 0: a single request keeps (or brings) one pod.
                    "activationThreshold": "0",
                    "ignoreNullValues": "true",
                },
            }
            for name, (query, threshold) in triggers.items()
        ],
    }
    if a.minReplicas == 0:  # KEDA waits this long after the last activity before going to zero
        spec["cooldownPeriod"] = a.scaleDownStabilizationSeconds
    return manifest(SCALED_OBJECT, owner, spec)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"
