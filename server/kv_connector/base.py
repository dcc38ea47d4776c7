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
    from argosy.server.kv_transfer.params import KVTransferParams
    from argosy.server.kv_transfer.transfer_scheduler import SideChannelAddress


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

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """Takes a step's report."""
        ...

    def take_events(self) -> tuple[list[bytes], list[bytes]]:
        """The hashes of the blocks it took in (of those the device had cached) and let go of since the
        last call, for KV events; handed over once."""
        ...

    def count_hits(self, num_tokens: int) -> None:
        """Prompt tokens it supplied (beside the prefix cache's hits), for its statistics."""
        ...

    def request_finished(self, seq: Sequence) -> list[int]:
        """The sequence left (finished, aborted, preempted): its pending loads are forgotten. Returns
        the blocks of it the connector keeps (for another replica to pull), which the KV-cache manager
        holds until `take_released` gives them back."""
        ...

    def take_released(self) -> list[int]:
        """Blocks it kept whose holds have ended since the last call; handed over once."""
        ...

    def take_refused(self) -> list[tuple[str, str]]:
        """(request id, why) of the loads refused as the request's fault since the last call."""
        ...

    def transfer_params(self, seq: Sequence) -> KVTransferParams | None:
        """What a finished sequence's answer tells another replica (where its kept blocks are)."""
        ...

    @property
    def busy(self) -> bool:
        """It waits on something outside the steps (blocks kept, transfers in flight): an idle engine
        still polls its workers."""
        ...

    def reset(self) -> None:
        """Forgets what it holds (the weights changed, or the cache was reset)."""
        ...


class ConnectorWorker(Protocol):
    def start(self, kv_cache: object, meta: KVConnectorMeta) -> None:
        """Starts the step's saves, then its loads, before the forward pass."""
        ...

    def finished(self, wait: float = 0.0) -> KVConnectorOutput:
        """What finished (or failed) since the last report, waiting up to `wait` seconds for a transfer
        in flight when none has (a step with nothing to compute: the engine would only spin)."""
        ...

    address: SideChannelAddress | None  # where other replicas pull its blocks from (None, or absent: nowhere)
