"""Owner: the object of one of Argosy's kinds that a built object belongs to."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from argosy.operator.kinds import INFERENCE_SERVICE, Kind


class Owner(BaseModel):
    name: str
    namespace: str
    uid: str
    generation: int = 1
    kind: Kind = INFERENCE_SERVICE
    role: str | None = None  # one role's pods of a disaggregated service (prefill, decode)

    @property
    def object_name(self) -> str:
        """The name of the objects built for it: a role's are `<name>-<role>`."""
        return self.name if self.role is None else f"{self.name}-{self.role}"

    def as_role(self, role: str) -> Owner:
        return self.model_copy(update={"role": role})

    @classmethod
    def from_body(cls, body: dict[str, Any], kind: Kind = INFERENCE_SERVICE) -> Owner:
        meta = body["metadata"]
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            generation=meta.get("generation", 1),
            kind=kind,
        )
