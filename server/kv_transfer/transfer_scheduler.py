"""The P/D connector's engine half (TransferScheduler). On a prefill replica: a request that asked
`do_remote_decode` keeps its prompt's full blocks when it finishes, its answer naming them; they go
back when the decode side has pulled them or after `hold_timeout` seconds. On a decode replica: a
request whose params say `do_remote_prefill` loads the prompt's full blocks after its own prefix
hits from where they are held (once: a request preempted later computes them itself), and
computes the rest. A pull the prefill side refuses fails the request (its params are forged or
stale); one that finds nobody there costs a recomputation."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from argosy.server.kv_connector.output import KVConnectorOutput
from argosy.server.kv_transfer.hold_token import sign
from argosy.server.kv_transfer.params import KVTransferParams
from argosy.server.kv_transfer.wire import PullRequest

if TYPE_CHECKING:
    from argosy.server.engine.sequence import Sequence


LENT_SECONDS = 480.0  # how long blocks lent to a NIXL read wait for it to say it is done (a reader gone)


class Pull(msgspec.Struct, array_like=True, frozen=True):
    seq_id: int  # -1: nothing wanted, the hold is only let go
    address: str  # the prefill side channel, tcp://host:port
    request: PullRequest  # without the puller's layout: its worker adds it
    local_block_ids: list[int]


class TransferMeta(msgspec.Struct, tag="kv_transfer", array_like=True):
    releases: list[tuple[str, float]] = []  # (request id, deadline) of holds that ended: never served from now on
    pulls: list[Pull] = []
    cancels: list[int] = []  # sequences that left while pulling: what arrives for them is dropped


@dataclass
class TransferStats:
    blocks_pulled: int = 0
    blocks_sent: int = 0
    bytes_moved: int = 0
    seconds: float = 0.0  # pulls' wall time
    holds_expired: int = 0
    pulls_failed: int = 0
    pulls_refused: int = 0


class SideChannelAddress(msgspec.Struct, array_like=True, frozen=True):
    """Where a prefill replica's blocks are pulled from, as its worker half bound it, and the secret
    its holds are signed with."""

    engine_id: str
    host: str
    port: int
    secret: bytes


class TransferScheduler:
    def __init__(self, address: SideChannelAddress, block_size: int, hold_timeout: float):
        self.address, self.block_size, self.hold_timeout = address, block_size, hold_timeout
        self.stats = TransferStats()
        self._holds: dict[str, tuple[list[int], float]] = {}  # request id -> (blocks, deadline)
        self._pulling: dict[int, tuple[str, list[int]]] = {}  # seq id -> its request id, the blocks it loads
        self._quarantined: dict[int, list[int]] = {}  # seq id -> the blocks of a pull it left, until it ends
        self._pulled: set[str] = set()  # requests that have had their pull (a second admission computes)
        self._released: list[int] = []
        self._refused: list[tuple[str, str]] = []
        self._meta = TransferMeta()

    @property
    def busy(self) -> bool:
        """Blocks held or pulls in flight: the engine polls its workers meanwhile, even idle."""
        return bool(self._holds or self._pulling or self._quarantined)

    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_blocks: int) -> int:
        params = seq.request.options.kv_transfer
        if params is None or not params.do_remote_prefill or seq.request.request_id in self._pulled:
            return 0
        prompt_blocks = (len(seq.request.prompt_token_ids) - 1) // self.block_size  # one token left to compute
        count = max(0, min(len(params.remote_block_ids), prompt_blocks) - num_computed_blocks)
        if not count:  # all cached here already: the prefill side is told to let its hold go
            self._meta.pulls.append(Pull(-1, _address(params), _pull_request(params, []), []))
            self._pulled.add(seq.request.request_id)
        return count * self.block_size

    def update_state_after_alloc(self, seq: Sequence, block_ids: list[int]) -> None:
        params, request_id = seq.request.options.kv_transfer, seq.request.request_id
        first = len(seq.block_table) - len(block_ids)
        wanted = params.remote_block_ids[first : first + len(block_ids)]
        self._meta.pulls.append(Pull(seq.seq_id, _address(params), _pull_request(params, wanted), block_ids))
        self._pulling[seq.seq_id] = (request_id, block_ids)
        self._pulled.add(request_id)

    def on_evict(self, block_id: int, block_hash: bytes) -> None:
        pass

    def request_finished(self, seq: Sequence) -> list[int]:
        """A prefill request that finished on its own keeps its prompt's full blocks for the decode side;
        a decode that leaves while pulling keeps the blocks it pulls into until the pull has ended."""
        request = seq.request
        if seq.finish_reason is not None:  # it left (a preempted one comes back, and must not pull twice)
            self._pulled.discard(request.request_id)
        if (pulling := self._pulling.pop(seq.seq_id, None)) is not None:
            self._meta.cancels.append(seq.seq_id)
            self._quarantined[seq.seq_id] = pulling[1]
            return pulling[1]
        params = request.options.kv_transfer
        if params is None or not params.do_remote_decode or seq.finish_reason not in ("stop", "length"):
            return []
        blocks = seq.block_table[: len(request.prompt_token_ids) // self.block_size]
        if blocks:  # a prompt shorter than a block leaves nothing to pull: the answer names no hold
            self._holds[request.request_id] = (blocks, time.monotonic() + self.hold_timeout)
        return blocks

    def transfer_params(self, seq: Sequence) -> KVTransferParams | None:
        """What a finished prefill request's answer says: where its blocks are held."""
        request_id = seq.request.request_id
        if request_id not in self._holds:
            return None
        a, (blocks, deadline) = self.address, self._holds[request_id]
        token = sign(a.secret, request_id, blocks, deadline)
        return KVTransferParams(False, True, a.engine_id, a.host, a.port, blocks, request_id, 1, deadline, token)

    def build_connector_meta(self) -> TransferMeta | None:
        now = time.monotonic()
        for request_id in [r for r, (_, deadline) in self._holds.items() if deadline <= now]:
            self._release(request_id)
            self.stats.holds_expired += 1
        meta, self._meta = self._meta, TransferMeta()
        return meta if meta.releases or meta.pulls or meta.cancels else None

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        for request_id in output.lent:  # a NIXL read takes them: kept until it says it is done, or long after
            if request_id in self._holds:
                blocks, deadline = self._holds[request_id]
                self._holds[request_id] = (blocks, max(deadline, time.monotonic() + LENT_SECONDS))
        for request_id in output.finished_sends:
            if request_id in self._holds:
                self._release(request_id)
        for seq_id in output.finished_loads:
            self._pulling.pop(seq_id, None)
        for seq_id, why in output.refused:
            if (pulling := self._pulling.pop(seq_id, None)) is not None:
                self._refused.append((pulling[0], why))
        for seq_id in output.cancels_done:
            self._released += self._quarantined.pop(seq_id, [])
        stats = self.stats
        stats.blocks_pulled += output.blocks_pulled
        stats.blocks_sent += output.blocks_sent
        stats.bytes_moved += output.bytes_moved
        stats.seconds += output.seconds
        stats.pulls_failed += output.pulls_failed
        stats.pulls_refused += len(output.refused)

    def take_released(self) -> list[int]:
        """Blocks it kept that it no longer needs since the last call (holds pulled or held too long,
        pulls ended after their sequence left): the manager lets them go."""
        released, self._released = self._released, []
        return released

    def take_refused(self) -> list[tuple[str, str]]:
        """(request id, why) of the pulls the prefill side refused since the last call."""
        refused, self._refused = self._refused, []
        return refused

    def take_events(self) -> tuple[list[bytes], list[bytes]]:
        return [], []

    def count_hits(self, num_tokens: int) -> None:
        pass  # the pulled blocks are counted by the worker half, in blocks and bytes

    def reset(self) -> None:
        pass  # nothing cached of its own: a reset waits while any block is held

    def _release(self, request_id: str) -> None:
        blocks, deadline = self._holds.pop(request_id)
        self._released += blocks
        self._meta.releases.append((request_id, deadline))


def _address(params: KVTransferParams) -> str:
    return f"tcp://{params.remote_host}:{params.remote_port}"


def _pull_request(params: KVTransferParams, wanted: list[int]) -> PullRequest:
    """The pull of `wanted` of the blocks `params` say are held, its layout left for the worker to fill in."""
    held, deadline = params.remote_block_ids, params.hold_deadline
    return PullRequest(
        params.remote_engine_id, params.remote_request_id, held, deadline, params.hold_token, wanted, None
    )
