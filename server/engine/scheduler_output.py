"""SchedulerOutput: what one step of the Scheduler decided, in sequences and blocks; its own
module, so that the waiting queues that charge what ran need not import the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field

from argosy.server.engine.sequence import Sequence
from argosy.server.kv_connector.metadata import KVConnectorMeta


class ScheduledSequence:
    __slots__ = ("completes", "draft", "num_new_tokens", "seq")

    def __init__(self, seq: Sequence, num_new_tokens: int, draft: list[int] | None = None):
        self.seq = seq
        self.draft = draft or []  # proposed tokens computed after the sequence's own, to verify
        # Tokens computed this step, from seq.num_computed_tokens: the sequence's, then the draft.
        self.num_new_tokens = num_new_tokens + len(self.draft)
        # After this step every token of the sequence is in the cache: sample the next.
        self.completes = seq.num_computed_tokens + num_new_tokens == seq.num_tokens

    def __repr__(self) -> str:
        return f"ScheduledSequence({self.seq!r}, {self.num_new_tokens})"


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    kv_connector: KVConnectorMeta | None = None  # the KV connector's transfers

    @property
    def has_work(self) -> bool:
        """A forward pass to run, or transfers to make."""
        return bool(self.scheduled or self.kv_connector is not None)
