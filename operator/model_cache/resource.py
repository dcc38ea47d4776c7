"""The ModelCache resource as a whole: its status as typed models (each node's copy, written by
that node's agent; the counts and conditions, by the operator) and its description."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from argosy.operator.custom_resource import AGE_COLUMN, READY_COLUMN, CustomResource
from argosy.operator.kinds import MODEL_CACHE
from argosy.operator.model_cache.spec import ModelCacheSpec
from argosy.operator.resource import Condition

Phase = Literal["Pending", "Copying", "Verifying", "Ready", "Failed", "Evicting"]
_INT64 = {"format": "int64"}


class NodeCopyStatus(BaseModel):
    """One node's copy, as its agent reports it (each agent writes its own node's entry only)."""

    phase: Phase = Field(description="Pending, Copying, Verifying, Ready, Failed or Evicting.")
    bytesDone: int = Field(0, json_schema_extra=_INT64, description="Bytes copied (or verified) so far.")
    bytesTotal: int = Field(0, json_schema_extra=_INT64, description="Bytes of the whole copy.")
    bytesPerSecond: int = Field(0, json_schema_extra=_INT64, description="The copy's recent rate.")
    attempts: int = Field(0, description="Copies started, the current one included.")
    reason: str | None = Field(None, description="Why it is not Ready, in CamelCase.")
    message: str | None = Field(None, description="Why, for people.")
    observedGeneration: int | None = Field(
        None, json_schema_extra=_INT64, description="The spec generation the copy is of."
    )
    lastTransitionTime: str | None = Field(
        None, json_schema_extra={"format": "date-time"}, description="When the phase last changed."
    )


class ModelCacheStatus(BaseModel):
    """Each node's copy, and the counts and kstatus conditions over them."""

    observedGeneration: int | None = Field(None, json_schema_extra=_INT64, description="The spec generation seen.")
    desiredNodes: int | None = Field(None, description="Nodes the ModelCache selects that run an agent.")
    readyNodes: int | None = Field(None, description="Nodes whose copy is Ready.")
    nodes: dict[str, NodeCopyStatus] = Field(default_factory=dict, description="Each node's copy, by node name.")
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Ready, Reconciling and Stalled.",
    )


class ModelCache(BaseModel):
    """A checkpoint held on the local disks of a set of nodes, verified file by file."""

    spec: ModelCacheSpec
    status: ModelCacheStatus | None = None


MODEL_CACHE_RESOURCE = CustomResource(
    kind=MODEL_CACHE,
    model=ModelCache,
    singular="modelcache",
    short_names=("mc",),
    printer_columns=(
        READY_COLUMN,
        {"name": "Nodes", "type": "integer", "jsonPath": ".status.readyNodes", "description": "Nodes holding it"},
        {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredNodes"},
        AGE_COLUMN,
    ),
)
