"""The KV connector's two halves, as vLLM's KV connector (v1) splits them. The engine half
(ConnectorScheduler) lives beside the KV-cache manager: it says how many of a sequence's tokens,
after those the device's prefix cache holds, it can supply; it is told which blocks were taken
for them; it describes each step's transfers in plain data for the plan (its metadata); and it
learns from each step's result which loads have finished or failed. The worker half
(ConnectorWorker) lives beside each rank's KV cache: it starts the step's loads and saves before
the forward pass and reports what finished in the step's result.

A sequence whose blocks load is admitted (it holds a seat and its blocks) but computes nothing
until its loads are reported finished, however many steps that takes; the others go on. A load
that fails is reported by its blocks: the sequence computes again from the first of them, and no
failed block enters the prefix cache, so a failure costs time, never tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from argosy.server.kv_connector.output import KVConnectorOutput

if TYPE_CHECKING:
    from argosy.server.engine.sequence import Sequence
    from argosy.server.kv_connector.metadata import KVConnectorMeta


class ConnectorScheduler(Protocol):
    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_blocks: int) -> int:
        """Tokens after the first `num_computed_blocks` blocks of `seq` (the device's hits) that the
        connector can supply, in whole blocks, leaving at least one token to compute."""
        ...

    def update_state_after_alloc(self, seq: Sequence, block_ids: list[int]) -> None:
        """The blocks taken for the tokens it said it could supply: it loads into them."""
        ...

    def on_evict(self, block_id: int, block_hash: bytes) -> None:
        """A cached block's contents are about to be overwritten (a connector may save them)."""
        ...

    def build_connector_meta(self) -> KVConnectorMeta | None:
        """The step's transfers, for the plan; handed over once."""
        ...

    def update_connector_output(self, output: KVConnectorOutput) -> list[tuple[int, int, bytes]]:
        """Takes a step's report; returns the (sequence, block, hash) of the blocks now loaded,
        for the prefix cache."""
        ...

    def take_events(self) -> tuple[list[bytes], list[bytes]]:
        """The hashes of the blocks it took in (of those the device had cached) and let go of since the
        last call, for KV events; handed over once."""
        ...

    def count_hits(self, num_tokens: int) -> None:
        """Prompt tokens it supplied (beside the prefix cache's hits), for its statistics."""
        ...

    def request_finished(self, seq: Sequence) -> None:
        """The sequence left (finished, aborted, preempted): its pending loads are forgotten."""
        ...

    def reset(self) -> None:
        """Forgets what it holds (the weights changed, or the cache was reset)."""
        ...


class ConnectorWorker(Protocol):
    def start(self, kv_cache: object, meta: KVConnectorMeta) -> None:
        """Starts the step's saves, then its loads, before the forward pass."""
        ...

    def finished(self) -> KVConnectorOutput:
        """What finished (or failed) since the last report."""
        ...
