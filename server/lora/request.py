"""How a request names its adapter. `LoRARequest` is the offline API's, as vLLM's (a name, an
integer id, a folder); `AdapterRef` is what the engine core is handed: the name, the folder,
and the digest of the weights as they were when the adapter was registered, which is the
adapter's identity wherever KV blocks or device slots are shared."""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

# What a model name may be: what Kubernetes and routers carry in labels and headers without quoting.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,252}$")


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


class AdapterRef(msgspec.Struct, array_like=True, frozen=True):
    name: str
    path: str
    digest: str  # sha256 of adapter_model.safetensors and the scaling applied to it, hex

    @property
    def hash_seed(self) -> bytes:
        """What the chain of a sequence's block hashes starts from: blocks computed with
        different weights never match."""
        return bytes.fromhex(self.digest)
