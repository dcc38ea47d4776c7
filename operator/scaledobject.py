"""InferenceService -> the KEDA ScaledObject that scales its Deployment on the queue depth.

The trigger sums `argosy_num_requests_waiting` over exactly this service's pods. The server
exports that gauge with a `model_name` label only; which pod a series comes from is told by
the `namespace` and `pod` labels that Prometheus attaches when it scrapes Kubernetes pods (a
PodMonitor does by default; a `kubernetes_sd_configs` pod job does with the usual relabelling
of `__meta_kubernetes_namespace` and `__meta_kubernetes_pod_name`). Deployment pods are named
`<deployment>-<template hash>-<5 characters>`, which the pod regex matches and nothing else."""

from __future__ import annotations

from typing import Any

from argosy.operator.labels import metadata
from argosy.operator.spec import AutoscalingSpec, Owner

WAITING_METRIC = "argosy_num_requests_waiting"


def waiting_requests_query(owner: Owner) -> str:
    pods = f"{owner.name}-[a-z0-9]{{1,10}}-[a-z0-9]{{5}}"
    return f'sum({WAITING_METRIC}{{namespace="{owner.namespace}",pod=~"{pods}"}}) or vector(0)'


def build_scaled_object(owner: Owner, autoscaling: AutoscalingSpec) -> dict[str, Any]:
    a = autoscaling
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": owner.name},
        "minReplicaCount": a.minReplicas,
        "maxReplicaCount": a.maxReplicas,
        "pollingInterval": a.pollingIntervalSeconds,
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "behavior": {
                    # Scale down slowly: a pod's queue drains before it goes.
                    "scaleDown": {
                        "stabilizationWindowSeconds": a.scaleDownStabilizationSeconds,
                        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
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
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": a.prometheusAddress,
                    "query": waiting_requests_query(owner),
                    "threshold": _number(a.targetWaitingRequests),
                    "activationThreshold": "0",
                    "ignoreNullValues": "true",
                },
            }
        ],
    }
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": metadata(owner), "spec": spec}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
