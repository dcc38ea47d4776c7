"""CustomResource: what the operator knows of one of its own kinds beyond the schema (the
markers Kubebuilder puts on a root type). The CRD generator, the labels of owned objects, the
RBAC table and the handlers all read it (and the labels its Kind), so that a second kind is a
second description."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from argosy.operator.kinds import Kind

# Printer columns every kind shows: its kstatus readiness, and its age.
READY_COLUMN = {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'}
AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


@dataclass(frozen=True, eq=False)  # one description per kind: compared and hashed by identity
class CustomResource:
    kind: Kind
    model: type[BaseModel]  # the root type: spec and status, whose models give the schema
    singular: str
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ("argosy",)
    printer_columns: tuple[dict[str, Any], ...] = ()  # what `kubectl get` shows
    subresources: dict[str, Any] = field(default_factory=lambda: {"status": {}})

    @property
    def crd_name(self) -> str:
        return f"{self.kind.plural}.{self.kind.group}"

    @property
    def names(self) -> dict[str, Any]:
        return {
            "kind": self.kind.kind,
            "listKind": f"{self.kind.kind}List",
            "plural": self.kind.plural,
            "singular": self.singular,
            "shortNames": list(self.short_names),
            "categories": list(self.categories),
        }
