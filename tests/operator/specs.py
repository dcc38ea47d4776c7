"""A table of InferenceService specs covering every option, shared by the builder tests."""

from __future__ import annotations

MODEL = {
    "name": "llama-3-8b-instruct",
    "path": "llama-3-8b-instruct",
    "hostPath": "/mnt/nvme/models",
    "nodeSelector": {"argosy.dev/model-llama-3-8b": "true"},
}
AUTOSCALING = {
    "minReplicas": 1,
    "maxReplicas": 8,
    "targetWaitingRequests": 5,
    "prometheusAddress": "http://prometheus.monitoring:9090",
}
ROUTING = {"endpointPicker": {"name": "llama-epp"}}

ADAPTERS = [{"name": "sql-tuned", "path": "adapters/sql"}, {"name": "support/v2", "path": "adapters/support-v2"}]

SPECS = {
    "lora": {
        "model": MODEL,
        "lora": {"maxLoras": 4, "maxLoraRank": 64, "maxCpuLoras": 8},
        "adapters": ADAPTERS,
    },
    "adapters-only": {"model": MODEL, "adapters": ADAPTERS[:1]},
    "plain-gpu": {"model": MODEL, "resources": {"limits": {"nvidia.com/gpu": 1}}},
    "tensor-parallel": {
        "model": MODEL,
        "engine": {"tensorParallelSize": 2},
        "resources": {"limits": {"nvidia.com/gpu": "2"}},
    },
    "across-nodes": {  # two stages of 8 ranks: a LeaderWorkerSet of groups of 2 pods, scaled by KEDA
        "model": MODEL,
        "engine": {"tensorParallelSize": 8, "pipelineParallelSize": 2},
        "resources": {"limits": {"nvidia.com/gpu": 8}},
        "autoscaling": AUTOSCALING,
        "routing": ROUTING,
    },
    "pipeline-in-one-pod": {  # two stages of 2 ranks in one pod of 4 GPUs: a Deployment
        "model": MODEL,
        "engine": {"tensorParallelSize": 2, "pipelineParallelSize": 2},
        "resources": {"limits": {"nvidia.com/gpu": 4}},
    },
    "tensor-parallel-lora-and-draft": {  # each rank its share of an adapter; the draft whole on rank 0
        "model": MODEL,
        "engine": {
            "tensorParallelSize": 2,
            "speculativeConfig": {"method": "draft_model", "numSpeculativeTokens": 4, "model": "d"},
        },
        "lora": {"maxLoras": 2},
        "adapters": ADAPTERS[:1],
        "resources": {"limits": {"nvidia.com/gpu": "2"}},
    },
    "pvc": {
        "model": {"name": "qwen3-8b", "path": "Qwen3-8B", "persistentVolumeClaim": {"claimName": "models"}},
        "replicas": 3,
        "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "40Gi"}, "requests": {"cpu": "4", "memory": "32Gi"}},
    },
    "autoscaled": {"model": MODEL, "autoscaling": AUTOSCALING, "resources": {"limits": {"nvidia.com/gpu": 1}}},
    "model-cache": {
        "model": {"name": "llama-3-8b", "cacheRef": {"name": "llama-3-8b"}},
        "autoscaling": AUTOSCALING,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]},
                        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h200"]}]},
                    ]
                }
            }
        },
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    },
    "fractional-target": {
        "model": MODEL,
        "autoscaling": {**AUTOSCALING, "minReplicas": 2, "targetWaitingRequests": 2.5},
    },
    "surge-rollout": {
        "model": MODEL,
        "rollout": {"maxSurge": 1, "maxUnavailable": 0},
        "disruptionBudget": {"maxUnavailable": "25%"},
    },
    "tuned-engine": {
        "model": MODEL,
        "engine": {
            "maxModelLen": 8192,
            "maxNumSeqs": 128,
            "maxNumBatchedTokens": 8192,
            "blockSize": 32,
            "gpuMemoryUtilization": 0.85,
            "dtype": "bfloat16",
            "attentionBackend": "triton",
            "enforceEager": False,
            "cudaGraphSizes": [1, 2, 4, 8, 16],
            "quantization": "fp8",
            "enablePrefixCaching": False,
            "enableChunkedPrefill": False,
            "maxWaitingRequests": 64,
            "shutdownTimeoutSeconds": 120,
            "engineStepTimeoutSeconds": 300,
            "speculativeConfig": {"method": "draft_model", "numSpeculativeTokens": 4, "model": "llama-3.2-1b"},
            "schedulingPolicy": "priority",
            "apiKeySecretRef": {"name": "llm-keys", "key": "api-key"},
        },
    },
    "cpu-node": {
        "model": MODEL,
        "engine": {
            "kvCacheMemory": 4294967296,
            "dtype": "float32",
            "speculativeConfig": {"method": "ngram", "numSpeculativeTokens": 3, "promptLookupMax": 4},
            "schedulingPolicy": "fair",
            "swapSpace": 2.5,
        },
        "resources": {"requests": {"cpu": "8", "memory": "16Gi"}},
    },
    "scheduling": {
        "model": MODEL,
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "svc"}},
                        },
                    }
                ]
            }
        },
        "priorityClassName": "inference",
        "serviceAccountName": "llm",
        "imagePullSecrets": [{"name": "registry"}],
        "image": "registry.example.com/argosy:0.1.0",
        "imagePullPolicy": "Always",
        "podAnnotations": {"team": "ml"},
        "startupTimeoutSeconds": 3600,
        "shmSize": "8Gi",
        "disruptionBudget": {"maxUnavailable": "50%"},
    },
    "pool-only": {"model": MODEL, "routing": ROUTING},
    "routed-from-zero": {
        "model": MODEL,
        "autoscaling": {**AUTOSCALING, "minReplicas": 0, "scaleDownStabilizationSeconds": 600},
        "routing": {
            "endpointPicker": {"name": "llama-epp", "port": 9102, "failureMode": "FailOpen"},
            "route": {
                "gateway": {"name": "inference-gateway", "namespace": "gateways", "sectionName": "https"},
                "hostnames": ["llm.example.com"],
                "pathPrefix": "/v1",
                "matchModelHeader": True,
                "requestTimeoutSeconds": 900,
            },
        },
    },
    "router-kv-aware": {"model": MODEL, "routing": {"router": {}}, "autoscaling": AUTOSCALING},
    "disaggregated": {  # two prefill pods and four decode pods behind the router's P/D mode
        "model": MODEL,
        "routing": {"router": {"policy": "round_robin"}},
        "resources": {"limits": {"nvidia.com/gpu": 1}},
        "disaggregation": {
            "prefill": {"replicas": 2, "engine": {"maxNumSeqs": 16, "maxNumBatchedTokens": 16384}},
            "decode": {
                "engine": {"maxNumSeqs": 512},
                "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "64Gi"}},
                "autoscaling": {**AUTOSCALING, "minReplicas": 4},
            },
            "kvTransferConfig": {"kvConnector": "NixlConnector", "port": 5700, "holdTimeoutSeconds": 60},
        },
    },
    "router-model-cache": {  # the router tokenizes from the node's copy of the model
        "model": {"name": "llama-3-8b", "cacheRef": {"name": "llama-3-8b"}},
        "routing": {"router": {"policy": "cache_aware", "replicas": 2, "image": "registry.example.com/router:1"}},
        "engine": {"kvEventsConfig": {"port": 6000, "replayPort": 6001, "bufferSteps": 500}},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}
