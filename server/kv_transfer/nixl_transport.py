"""NixlTransport: the NIXL library (UCX underneath: RDMA where the network has it, TCP or shared
memory where it does not; device memory with CUDA) moving a hand-off's bytes instead of the side
channel's socket, as vLLM's NIXL connector does: the decode worker READs the blocks. The side
channel still decides: only for a pull whose hold checks out does it answer with the prefill
agent's metadata and the regions of exactly the blocks wanted. The READ notifies the prefill side
when it is done (the hold then ends, as a pulled one does); the decode worker waits for its READ
to finish or fail, so nothing lands in its blocks after it has given up on them.

Optional: `pip install 'argosy[nixl]'` (the nixl-cu12 wheel; its CUDA-built torch is not needed)."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

import numpy as np
import torch

INSTALL = "NixlConnector needs the NIXL library: pip install 'argosy[nixl]'"
STATE_POLL_SECONDS = 0.0005


def nixl_api() -> Any:
    """The NIXL Python API (the nixl-cu12 wheel, or the nixl meta-package's), or ImportError saying how to get it."""
    try:
        from nixl_cu12 import _api
    except ImportError:
        try:
            from nixl import _api
        except ImportError as exc:
            raise ImportError(INSTALL) from exc
    return _api


def block_regions(kv_cache: torch.Tensor, block_ids: list[int]) -> np.ndarray:
    """(address, bytes, device) of each block of each layer's K and V, in one order on both sides:
    the cache is [layers, 2, blocks, block_size, kv_heads, head_dim], contiguous."""
    layers, kv, num_blocks = kv_cache.shape[:3]
    size = kv_cache[0, 0, 0].numel() * kv_cache.element_size()
    device = max(kv_cache.get_device(), 0)
    planes = np.arange(layers * kv, dtype=np.uint64)[:, None] * num_blocks
    offsets = (planes + np.asarray(block_ids, dtype=np.uint64)[None, :]).reshape(-1) * size
    regions = np.empty((len(offsets), 3), dtype=np.uint64)
    regions[:, 0], regions[:, 1], regions[:, 2] = kv_cache.data_ptr() + offsets, size, device
    return regions


class NixlTransport:
    def __init__(self, name: str):
        api = nixl_api()
        # No progress thread: it spins a core even idle (2.2 s of CPU in 3 s, measured). Progress is made
        # in the calls: the reader polls its READ, the side channel polls for notifications.
        self._agent = api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        self._registered: torch.Tensor | None = None
        self._remotes: dict[bytes, str] = {}  # a peer's metadata digest -> its agent's name here
        self._lock = threading.Lock()  # the worker, the side channel and the pull threads share the agent

    def register(self, kv_cache: torch.Tensor) -> None:
        with self._lock:
            if self._registered is not kv_cache:
                self._agent.register_memory(kv_cache)
                self._registered = kv_cache

    def source(self, kv_cache: torch.Tensor, block_ids: list[int]) -> tuple[bytes, bytes]:
        """This agent's metadata and the regions of `block_ids`, for a decode worker to read."""
        with self._lock:
            descs = self._agent.get_xfer_descs(block_regions(kv_cache, block_ids), _mem_type(kv_cache))
            return self._agent.get_agent_metadata(), self._agent.get_serialized_descs(descs)

    def read(
        self, metadata: bytes, descs: bytes, kv_cache: torch.Tensor, block_ids: list[int], notif: bytes, timeout: float
    ) -> None:
        """Reads the regions `descs` of the agent `metadata` into `block_ids` of `kv_cache`, then notifies
        it with `notif`. Raises when it fails or takes over `timeout` seconds; returns only once nothing
        more can land (a READ that cannot be cancelled is waited for)."""
        with self._lock:
            peer = self._remote(metadata)
            local = self._agent.get_xfer_descs(block_regions(kv_cache, block_ids), _mem_type(kv_cache))
            handle = self._agent.initialize_xfer("READ", local, self._agent.deserialize_descs(descs), peer, notif)
            state = self._agent.transfer(handle)
        deadline = time.monotonic() + timeout
        while state == "PROC" and time.monotonic() < deadline:
            time.sleep(STATE_POLL_SECONDS)
            with self._lock:
                state = self._agent.check_xfer_state(handle)
        try:
            with self._lock:
                self._agent.release_xfer_handle(handle)  # cancels one still running
        except Exception:  # it could not be cancelled: wait until it ends
            while state == "PROC":
                time.sleep(STATE_POLL_SECONDS)
                with self._lock:
                    state = self._agent.check_xfer_state(handle)
        if state != "DONE":
            raise RuntimeError(f"the NIXL read ended {state if state != 'PROC' else f'unfinished after {timeout:g}s'}")

    def notifs(self) -> list[bytes]:
        """The notifications of the READs done since the last call."""
        with self._lock:
            return [message for messages in self._agent.get_new_notifs().values() for message in messages]

    def _remote(self, metadata: bytes) -> str:
        key = hashlib.sha256(metadata).digest()
        if key not in self._remotes:
            self._remotes[key] = self._agent.add_remote_agent(metadata)
        return self._remotes[key]


def _mem_type(kv_cache: torch.Tensor) -> str:
    return "VRAM" if kv_cache.is_cuda else "DRAM"
