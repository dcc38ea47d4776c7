"""StepPlan: one step as the engine decided it, in plain data (no engine object crosses), for
an Executor to run on the device; and StepResult, what comes back. The device side keeps what
it needs of each sequence across steps (its block table, its generator, its tokens), so a plan
carries only what is new: sequences it has not seen, block-table changes, sequences it may
forget. msgspec structs, so that a plan can go to other processes as it is."""

from __future__ import annotations

import msgspec

from argosy.server.kv_connector.metadata import KVConnectorMeta
from argosy.server.kv_connector.output import KVConnectorOutput
from argosy.server.kv_transfer.transfer_scheduler import SideChannelAddress
from argosy.server.sampling_params import SamplingParams
from argosy.server.structured.params import StructuredOutputsParams


class NewSequence(msgspec.Struct, array_like=True):
    """A sequence the device side has not seen yet: what sampling it needs for its whole life."""

    seq_id: int
    request_id: str  # named in logs when it fails
    params: SamplingParams
    prompt_token_ids: list[int]  # penalties read them; empty for a fork, which takes its parent's
    seed: int | None  # of its generator: the request's seed plus the sequence's index
    fork_of: int | None = None  # the parent of a parallel sample (n > 1)
    lora_slot: int = -1  # the device slot of its adapter, for its whole life; -1: the base model


PLACEHOLDER = -1  # a chunk's last token, sampled by the step before, which the device side fills in


class ScheduledChunk(msgspec.Struct, array_like=True):
    """One sequence's share of the step."""

    seq_id: int
    token_ids: list[int]  # computed this step
    start: int  # position of the first of them
    sample: bool  # the logits of its last token are wanted (and of its drafts)
    # The block table's change since the device last had it: (entries kept, entries after them);
    # None when it did not change.
    blocks: tuple[int, list[int]] | None = None
    num_draft: int = 0  # the last of token_ids are drafts to verify


class SampleRow(msgspec.Struct, array_like=True):
    """A sequence to sample, from the logits of one chunk's last token; with a draft, the
    draft is verified from the logits of the chunk's last len(draft) + 1 tokens."""

    seq_id: int
    logits_row: int  # the first of its rows, among the rows of the chunks with `sample`, in order
    draft: list[int] = []
    propose: int = 0  # tokens the draft model proposes after the ones kept, for the next step


class StepPlan(msgspec.Struct, array_like=True):
    new_sequences: list[NewSequence]
    finished: list[int]  # sequences the device side may forget
    chunks: list[ScheduledChunk]
    block_copies: list[tuple[int, int]]  # (src, dst) copy-on-write, before the forward pass
    samples: list[SampleRow]
    # (slot, digest): adapters to copy into device slots, from host memory, before the forward pass.
    lora_loads: list[tuple[int, str]] = []
    # The KV connector's transfers (the host tier's copies), started before the block copies.
    kv_connector: KVConnectorMeta | None = None
    # Constraints whose grammars the device side compiles now, for requests the engine admits once
    # their compile is reported: each is known to compile within the time limit.
    grammars: list[StructuredOutputsParams] = []


class TokenLogprobs(msgspec.Struct, array_like=True):
    """Log-probabilities around one sampled token, from the raw model distribution."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]  # the most likely alternatives, best first


class StepResult(msgspec.Struct, array_like=True):
    """Per SampleRow of the plan, in order: its new tokens (one, or several a step accepted),
    their log-probabilities when asked for, or why it has none (its request fails alone)."""

    token_ids: list[list[int]]
    logprobs: list[list[TokenLogprobs] | None]
    errors: list[str | None]
    # Rows whose grammar is complete and allows nothing more after their tokens: they end (stop).
    complete: list[int] = []
    drafts: list[list[int]] = []  # the draft model's proposals, per row (none past the list's end)
    grammars_ready: list[str] = []  # keys of the plans' grammars compiled since the last result
    grammar_errors: dict[str, str] = {}  # and of those that failed, why
    kv_connector: KVConnectorOutput | None = None  # the loads the KV connector finished (or failed)


class DeviceReady(msgspec.Struct, array_like=True):
    """What the device side settled at start-up."""

    num_blocks: int  # KV-cache blocks for the sequences
    startup: str  # the start-up report's line: device, backend, graphs, memory, phase times
    kv_connector_blocks: int = 0  # the KV connector's blocks, as its worker half sized them (the host tier's slots)
    weight_bytes: int = 0  # rank 0's weights (a draft model's too)
    kv_block_bytes: int = 0  # one KV-cache block on rank 0
    kv_connector_address: SideChannelAddress | None = None  # where the P/D connector's blocks are pulled from
