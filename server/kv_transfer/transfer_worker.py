"""The P/D connector's worker half (TransferWorker), beside the rank's KV cache. On a prefill
replica its side channel serves the blocks the engine holds. On a decode replica it runs each
step's pulls on a small thread pool and writes what arrived into the blocks taken for it, between
steps (the sequences they are for compute nothing until then), or, with NIXL, reads them straight
into those blocks. What arrives for a sequence that left meanwhile is dropped; its blocks stay
taken until its pull has ended (a NIXL read may still be landing in them), then go back."""

from __future__ import annotations

import logging
import time
import uuid
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor

import msgspec
import torch
import zmq

from argosy.server.kv_connector.output import KVConnectorOutput
from argosy.server.kv_transfer.nixl_transport import NixlTransport
from argosy.server.kv_transfer.pull import NixlSource, PullFailed, PullRefused, layout_of, pull_blocks
from argosy.server.kv_transfer.side_channel import SideChannel
from argosy.server.kv_transfer.transfer_scheduler import Pull, SideChannelAddress, TransferMeta
from argosy.server.kv_transfer.wire import PullRequest

log = logging.getLogger("argosy.kv_transfer")
MAX_CONCURRENT_PULLS = 4


class TransferWorker:
    def __init__(
        self,
        block_shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        host: str,
        port: int,
        pull_timeout: float,
        nixl: bool = False,
    ):
        self.dtype, self.device, self.pull_timeout = dtype, device, pull_timeout
        self.layout = layout_of(block_shape, dtype)
        self.engine_id = uuid.uuid4().hex
        self.nixl = NixlTransport(self.engine_id) if nixl else None
        self.side_channel = SideChannel(self.engine_id, self.layout, host, port, self.nixl)
        self._context = zmq.Context()
        self._pool = ThreadPoolExecutor(MAX_CONCURRENT_PULLS, thread_name_prefix="kv-pull")
        self._pulls: dict[int, tuple[Pull, Future]] = {}
        self._cancelled: dict[int, Future] = {}  # pulls of sequences that left, until they end
        self._kv_cache: torch.Tensor | None = None
        self._sent_before = (0, 0)

    @property
    def address(self) -> SideChannelAddress:
        channel = self.side_channel
        return SideChannelAddress(self.engine_id, channel.host, channel.port, channel.secret)

    def start(self, kv_cache: torch.Tensor, meta: TransferMeta | None) -> None:
        self._kv_cache = self.side_channel.kv_cache = kv_cache
        if self.nixl is not None:
            self.nixl.register(kv_cache)
        if meta is None:
            return
        for seq_id in meta.cancels:  # its pull runs on (NIXL may still be writing): what it brings is dropped
            if seq_id in self._pulls:
                self._cancelled[seq_id] = self._pulls.pop(seq_id)[1]
        self.side_channel.revoke(meta.releases)
        for pull in meta.pulls:
            request = msgspec.structs.replace(pull.request, layout=self.layout, nixl=self.nixl is not None)
            future = self._pool.submit(self._pull, pull.address, request, pull.local_block_ids)
            if pull.local_block_ids:  # else it only lets the prefill side's hold go: nothing waits for it
                self._pulls[pull.seq_id] = (pull, future)

    def finished(self, wait: float = 0.0) -> KVConnectorOutput:
        pending = [future for _, future in self._pulls.values()]
        if wait and pending and not any(future.done() for future in pending):
            futures.wait(pending, wait, return_when=futures.FIRST_COMPLETED)
        sent, lent = self.side_channel.take_sent()
        out = KVConnectorOutput(finished_sends=sent, lent=lent)
        for seq_id in [s for s, future in self._cancelled.items() if future.done()]:
            del self._cancelled[seq_id]
            out.cancels_done.append(seq_id)
        for seq_id in [s for s, (_, future) in self._pulls.items() if future.done()]:
            pull, future = self._pulls.pop(seq_id)
            try:
                blocks, seconds = future.result()
            except PullRefused as exc:
                out.refused.append((seq_id, f"the prefill side refused the KV pull: {exc}"))
                continue
            except (PullFailed, zmq.ZMQError) as exc:  # the prefill side is gone: computed here instead
                log.warning("KV pull from %s failed (%s): the prompt is computed here", pull.address, exc)
                out.failed_blocks += pull.local_block_ids
                out.finished_loads.append(seq_id)
                out.pulls_failed += 1
                continue
            if isinstance(blocks, torch.Tensor):  # else read in place (NIXL)
                index = torch.tensor(pull.local_block_ids, device=self.device)
                self._kv_cache.index_copy_(2, index, blocks.to(self.device))
            out.finished_loads.append(seq_id)
            out.blocks_pulled += len(pull.local_block_ids)
            out.bytes_moved += len(pull.local_block_ids) * self.side_channel.block_bytes
            out.seconds += seconds
        blocks_sent, bytes_sent = self.side_channel.blocks_sent, self.side_channel.bytes_sent
        out.blocks_sent = blocks_sent - self._sent_before[0]
        out.bytes_moved += bytes_sent - self._sent_before[1]
        self._sent_before = (blocks_sent, bytes_sent)
        return out

    def close(self) -> None:
        self.side_channel.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _pull(self, address: str, request: PullRequest, local: list[int]) -> tuple[torch.Tensor | None, float]:
        started = time.monotonic()
        blocks = pull_blocks(self._context, address, request, self.dtype, self.pull_timeout)
        if isinstance(blocks, NixlSource):  # read straight into the blocks taken for them
            try:
                notif = request.request_id.encode()
                self.nixl.read(blocks.agent, blocks.descs, self._kv_cache, local, notif, self.pull_timeout)
            except RuntimeError as exc:
                raise PullFailed(str(exc)) from None
            blocks = None
        return blocks, time.monotonic() - started
