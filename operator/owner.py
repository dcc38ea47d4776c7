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
