"""Kubernetes' own shapes, as the InferenceService spec embeds them (quantities, references,
tolerations, resources), and CEL rules, which any model may carry."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One x-kubernetes-validations entry: the API server rejects objects where `rule` is false."""
    return {"rule": rule, "message": message, **({"fieldPath": field_path} if field_path else {})}


def rules(*entries: dict[str, str]) -> dict[str, Any]:
    """CEL rules as a model's or a field's extra schema (json_schema_extra)."""
    return {"x-kubernetes-validations": list(entries)}


# A Kubernetes quantity (1, "1", "500m", "40Gi") and a count or percentage ("1", 1, "25%").
Quantity = Annotated[int | str, Field(json_schema_extra={"pattern": "^[0-9.]+[a-zA-Z]*$"})]
IntOrPercent = Annotated[int | str, Field(json_schema_extra={"pattern": "^[0-9]+%$", "minimum": 0})]


class KubeModel(BaseModel):
    """Fields the models do not know are ignored (the API server prunes them anyway)."""

    model_config = ConfigDict(extra="ignore")


class VolumeClaim(KubeModel):
    """A PersistentVolumeClaim holding checkpoints; mounted read-only at /models."""

    claimName: str = Field(min_length=1, max_length=253, description="Name of the claim, in this namespace.")


class SecretKeyRef(KubeModel):
    """A key of a Secret in this namespace."""

    name: str = Field(min_length=1, description="Name of the Secret.")
    key: str = Field(min_length=1, description="Key within the Secret.")


class ResourceRequirements(KubeModel):
    """Container resources, e.g. limits {nvidia.com/gpu: 1}."""

    limits: dict[str, Quantity] = Field(default_factory=dict, description="Most of each resource the server may use.")
    requests: dict[str, Quantity] = Field(default_factory=dict, description="What the scheduler reserves.")


class LocalObjectReference(KubeModel):
    """An object in this namespace, by name."""

    name: str = Field(description="Name of the object.")


class Toleration(KubeModel):
    """A core/v1 Toleration: lets the pods run on nodes with a matching taint."""

    key: str | None = Field(None, description="Taint key; empty with operator Exists matches every taint.")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists, or Equal to value.")
    value: str | None = Field(None, description="Taint value, with operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all."
    )
    tolerationSeconds: int | None = Field(None, description="With NoExecute, how long the pod stays after the taint.")
