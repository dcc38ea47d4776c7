"""Sequence: one stream of tokens being generated, and Request: the n sequences that
answer one prompt (n > 1 with parallel sampling)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from argosy.server.engine.request_options import PLAIN, RequestOptions
from argosy.server.lora.request import AdapterRef
from argosy.server.sampling_params import SamplingParams

if TYPE_CHECKING:
    from argosy.server.spec_decode.speculative_state import SpeculativeState


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, seq_id: int, request: Request, index: int, token_ids: list[int]):
        self.seq_id = seq_id
        self.request = request
        self.index = index  # which of the request's n outputs this is
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        # The first entry of block_table that changed since the last step plan took it (None:
        # none did); the device side holds a copy, which a plan brings up to date.
        self.block_table_changed_from: int | None = 0
        self.block_hashes: list[bytes] = []  # content hashes of the leading full blocks
        self.status = SequenceStatus.WAITING
        self.preempted = False  # recomputed after losing its blocks at least once
        self.loading_kv = False  # admitted, its blocks loading through the KV connector: it computes nothing yet
        self.num_pending = 0  # PLACEHOLDERs ending token_ids: tokens a step in flight samples (async scheduling)
        self.num_computed_before_preemption = 0  # at its latest preemption
        self.preempted_for_priority = False  # then protected for MIN_RUN_STEPS after each return
        self.finish_reason: str | None = None
        self.stop_reason: int | None = None  # the stop token id that ended it
        self.speculation: SpeculativeState | None = None  # with speculative decoding, once it decodes
        self.admitted_step = 0  # the scheduler's step when it last started running

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def is_running(self) -> bool:
        return self.status is SequenceStatus.RUNNING

    def fork(self, seq_id: int, index: int) -> Sequence:
        """A sibling with the same tokens and progress; blocks are shared by the caller."""
        child = Sequence(seq_id, self.request, index, self.token_ids)
        child.num_computed_tokens = self.num_computed_tokens
        child.block_hashes = list(self.block_hashes)
        child.status = self.status
        return child

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
            f"blocks={self.block_table}, {self.status.value})"
        )


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    seqs: list[Sequence] = field(default_factory=list)
    first_scheduled_time: float | None = None
    num_cached_tokens: int = 0
    options: RequestOptions = PLAIN  # its adapter, priority, user and client, as it arrived
    lora_slot: int | None = None  # the adapter's device slot, held from its first admission to its end
    waiting_for_grammar: bool = False  # its constraint's grammar is still compiling: not admitted yet
    arrival_no: int = 0  # its place in the order of arrival, and the scheduler's step then:
    arrival_step: int = 0  # set when it is first queued

    @property
    def lora(self) -> AdapterRef | None:
        return self.options.lora

    @property
    def priority(self) -> int:
        return self.options.priority

    @property
    def user(self) -> str | None:
        return self.options.user

    @property
    def hash_seed(self) -> bytes | None:
        """What its block hashes chain from: the adapter's digest, so that KV computed with
        other weights is never shared."""
        return None if self.lora is None else self.lora.hash_seed

    @property
    def num_pending_forks(self) -> int:
        """Sequences still to fork from the first once the prompt is done (n > 1)."""
        return self.params.n - len(self.seqs)

    @property
    def is_finished(self) -> bool:
        return self.num_pending_forks == 0 and all(s.is_finished for s in self.seqs)
