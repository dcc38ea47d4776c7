"""RequestOptions: what a request asks of the engine beside its prompt and its sampling, built once
where the request arrives (an API call's body and peer, or `LLM.generate`'s arguments), checked
once by the input processor, and carried whole to the engine core, where its Request keeps it."""

from __future__ import annotations

import msgspec

from argosy.server.exceptions import InvalidRequestError
from argosy.server.kv_transfer.params import KVTransferParams
from argosy.server.lora.request import AdapterRef
from argosy.server.sampling_params import INT64
from argosy.server.scheduling.policy import MAX_USER_LENGTH, SchedulingPolicy

MAX_PIN_S = 86400.0


class RequestOptions(msgspec.Struct, array_like=True, frozen=True):
    lora: AdapterRef | None = None  # the adapter it runs with (None: the base model)
    priority: int = 0  # lower first, with --scheduling-policy priority
    user: str | None = None  # whose share it counts against, with --scheduling-policy fair
    client: str | None = None  # where it came from (the peer's address)
    kv_transfer: KVTransferParams | None = None  # prefill/decode disaggregation: hold its blocks, or pull them
    pin_s: float = 0.0  # seconds its blocks stay ahead in the prefix cache's eviction order once it ends

    @property
    def compile_client(self) -> str | None:
        """Whose share of the grammar compiles it takes: its user, or where it came from."""
        return self.user or self.client

    def check(self, policy: SchedulingPolicy) -> None:
        """Raises InvalidRequestError, naming the field, for options this engine cannot serve."""
        priority, user = self.priority, self.user
        if not (isinstance(priority, int) and -INT64 <= priority < INT64):
            raise InvalidRequestError(
                f"priority must be an integer in [-2^63, 2^63), got {priority!r}", param="priority"
            )
        if not (isinstance(self.pin_s, (int, float)) and 0 <= self.pin_s <= MAX_PIN_S):
            raise InvalidRequestError(f"pin_s must be in [0, {MAX_PIN_S}] seconds", param="pin_s")
        if user is not None and not (isinstance(user, str) and len(user) <= MAX_USER_LENGTH):
            raise InvalidRequestError(f"user must be a string of at most {MAX_USER_LENGTH} characters", param="user")
        if priority != 0 and policy != "priority":
            raise InvalidRequestError(
                f"priority {priority} is only served with --scheduling-policy priority (this server schedules "
                f"{policy})",
                param="priority",
            )


PLAIN = RequestOptions()
