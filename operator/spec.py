"""The InferenceService spec as typed models. Defaults equal the CRD's (a test holds them
together); the API server applies the CRD's, these apply when a builder is called directly."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

GROUP, VERSION, PLURAL, KIND = "argosy.dev", "v1alpha1", "inferenceservices", "InferenceService"
DEFAULT_IMAGE = "ghcr.io/argosy-dev/argosy:0.1.0"
SERVER_PORT = 8000
MODEL_MOUNT = "/models"


class _Spec(BaseModel):
    model_config = ConfigDict(extra="ignore")


class VolumeClaim(_Spec):
    claimName: str


class ModelSpec(_Spec):
    name: str
    path: str
    hostPath: str | None = None
    persistentVolumeClaim: VolumeClaim | None = None
    nodeSelector: dict[str, str] = Field(default_factory=dict)


class SecretKeyRef(_Spec):
    name: str
    key: str


class EngineSpec(_Spec):
    maxModelLen: int | None = None
    maxNumSeqs: int = 256
    maxNumBatchedTokens: int | None = None
    blockSize: int = 16
    gpuMemoryUtilization: float = 0.9
    kvCacheMemory: int | None = None
    enablePrefixCaching: bool = True
    enableChunkedPrefill: bool = True
    dtype: str = "auto"
    maxWaitingRequests: int = 1024
    shutdownTimeoutSeconds: int = 60
    apiKeySecretRef: SecretKeyRef | None = None


class AutoscalingSpec(_Spec):
    minReplicas: int = 1
    maxReplicas: int
    targetWaitingRequests: float = 5
    prometheusAddress: str
    pollingIntervalSeconds: int = 15
    scaleDownStabilizationSeconds: int = 300


class DisruptionBudgetSpec(_Spec):
    maxUnavailable: int | str = 1


class RolloutSpec(_Spec):
    maxSurge: int | str = 0
    maxUnavailable: int | str = 1


class InferenceServiceSpec(_Spec):
    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    image: str = DEFAULT_IMAGE
    imagePullPolicy: str = "IfNotPresent"
    imagePullSecrets: list[dict[str, str]] = Field(default_factory=list)
    resources: dict[str, dict[str, Any]] = Field(default_factory=dict)
    replicas: int = 1
    autoscaling: AutoscalingSpec | None = None
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] | None = None
    startupTimeoutSeconds: int = 1800
    shmSize: str = "1Gi"
    disruptionBudget: DisruptionBudgetSpec = Field(default_factory=DisruptionBudgetSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    podAnnotations: dict[str, str] = Field(default_factory=dict)
    serviceAccountName: str | None = None
    priorityClassName: str | None = None


class Owner(BaseModel):
    """The InferenceService a built object belongs to."""

    name: str
    namespace: str
    uid: str
    generation: int = 1

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Owner:
        meta = body["metadata"]
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                   generation=meta.get("generation", 1))
