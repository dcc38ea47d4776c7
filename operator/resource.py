"""The InferenceService resource as a whole: its status as typed models, and its description
(names, printer columns, subresources): INFERENCE_SERVICE_RESOURCE."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from argosy.operator.custom_resource import AGE_COLUMN, READY_COLUMN, CustomResource
from argosy.operator.kinds import INFERENCE_SERVICE
from argosy.operator.kube_types import cel, rules
from argosy.operator.spec import InferenceServiceSpec

# The name becomes a Service name (DNS-1035) and the prefix of pod names, which must stay
# whole for the autoscaling query to find them.
MAX_NAME_LENGTH = 46
MAX_ROLE_NAME_LENGTH = MAX_NAME_LENGTH - len("-prefill")  # the longer role's suffix


class Condition(BaseModel):
    """One kstatus condition: Ready, Reconciling or Stalled."""

    type: str = Field(description="Ready, Reconciling or Stalled.")
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str | None = Field(None, description="Why, in CamelCase.")
    message: str | None = Field(None, description="Why, for people.")
    observedGeneration: int | None = Field(
        None, json_schema_extra={"format": "int64"}, description="The spec generation the condition describes."
    )
    lastTransitionTime: str | None = Field(
        None, json_schema_extra={"format": "date-time"}, description="When status last changed."
    )


class ModelCacheUse(BaseModel):
    """The ModelCache of spec.model.cacheRef, as the service sees it."""

    name: str = Field(description="Its name.")
    readyNodes: int = Field(0, description="Nodes holding a ready copy, where the pods may run.")
    desiredNodes: int | None = Field(None, description="Nodes it selects.")
    message: str | None = Field(None, description="What limits the service, such as maxReplicas beyond readyNodes.")


class RoleStatus(BaseModel):
    """One role's pods under spec.disaggregation."""

    replicas: int = Field(0, description="Its pods that exist.")
    readyReplicas: int = Field(0, description="Its pods that are ready.")
    reason: str | None = Field(None, description="Its readiness, as the Ready condition's reason would say it alone.")


class RolesStatus(BaseModel):
    prefill: RoleStatus | None = None
    decode: RoleStatus | None = None


class DerivedThresholds(BaseModel):
    """What spec.autoscaling.objectives came to on the profiled engine: the triggers' values per replica."""

    runningRequests: int = Field(description="The batch within the inter-token latency objective.")
    outputTokensPerSecond: float = Field(description="What a replica generates at that batch (a trigger).")
    waitingRequests: int = Field(description="The queue a replica drains within the TTFT objective (a trigger).")
    kvCacheUsage: float = Field(description="The KV-cache usage of that batch (a trigger).")
    interTokenLatencySeconds: float = Field(description="The inter-token latency at that batch.")


class InferenceServiceStatus(BaseModel):
    """Observed state, in kstatus form, so Argo CD and Flux can read health."""

    observedGeneration: int | None = Field(
        None, json_schema_extra={"format": "int64"}, description="The spec generation this status describes."
    )
    replicas: int | None = Field(None, description="Server pods that exist.")
    readyReplicas: int | None = Field(None, description="Server pods that are ready.")
    selector: str | None = Field(None, description="Label selector of the server pods (for the scale subresource).")
    url: str | None = Field(None, description="The OpenAI-compatible API inside the cluster.")
    routerUrl: str | None = Field(None, description="With spec.routing.router: the API through the router.")
    modelCache: ModelCacheUse | None = Field(None, description="With spec.model.cacheRef: where copies are ready.")
    roles: RolesStatus | None = Field(None, description="With spec.disaggregation: each role's pods.")
    autoscaling: DerivedThresholds | None = Field(
        None, description="With spec.autoscaling.objectives: the thresholds derived from them."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Ready, Reconciling and Stalled; RouterReady with spec.routing.router.",
    )


class InferenceService(BaseModel):
    """An LLM served by a fleet of Argosy inference-server pods."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"
                f" && size(self.metadata.name) <= {MAX_NAME_LENGTH}",
                "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter) "
                f"of at most {MAX_NAME_LENGTH} characters",
                ".metadata.name",
            ),
            cel(
                f"!has(self.spec.disaggregation) || size(self.metadata.name) <= {MAX_ROLE_NAME_LENGTH}",
                f"metadata.name must be at most {MAX_ROLE_NAME_LENGTH} characters with spec.disaggregation: each "
                "role's Deployment is named <name>-prefill or <name>-decode",
                ".metadata.name",
            ),
        )
    )

    spec: InferenceServiceSpec
    status: InferenceServiceStatus | None = None


INFERENCE_SERVICE_RESOURCE = CustomResource(
    kind=INFERENCE_SERVICE,
    model=InferenceService,
    singular="inferenceservice",
    short_names=("ais",),
    printer_columns=(
        {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
        READY_COLUMN,
        {"name": "Replicas", "type": "integer", "jsonPath": ".status.readyReplicas", "description": "Ready replicas"},
        {"name": "Desired", "type": "integer", "jsonPath": ".status.replicas", "priority": 1},
        {"name": "URL", "type": "string", "jsonPath": ".status.url"},
        AGE_COLUMN,
    ),
    # status, and scale, so that `kubectl scale ais` (and HPAs) can set spec.replicas.
    subresources={
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    },
)
