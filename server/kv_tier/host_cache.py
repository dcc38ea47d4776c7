"""HostKVCache: the host tier's bytes, and the copies between them and the device's KV cache.

A slot holds one block of every layer's K and V, [layers, 2, block_size, kv_heads, head_dim],
contiguous, so that one block moves in one copy. On CUDA the slots are pinned and the copies run
on a side stream, ordered by events: the side stream starts after the work already queued (the
blocks the last step wrote are final), the step's forward pass waits only until the stored
blocks have been read on the device (it may overwrite them), and the next step waits for the
loads (the sequences that loaded compute then). On a CPU the same code runs in order: a copy
instead of a recomputation."""

from __future__ import annotations

import contextlib

import torch


class HostKVCache:
    def __init__(self, num_slots: int, block_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        """`block_shape`: one block of the device's cache, [layers, 2, block_size, kv_heads, head_dim]."""
        self.device = device
        on_cuda = device.type == "cuda"
        # Never read before a store writes it: no need to zero gigabytes at start-up.
        self.slots = torch.empty((num_slots, *block_shape), dtype=dtype, pin_memory=on_cuda)
        self.stream = torch.cuda.Stream(device) if on_cuda else None

    @property
    def nbytes(self) -> int:
        return self.slots.nbytes

    def copy(self, kv_cache: torch.Tensor, stores: list[tuple[int, int]], loads: list[tuple[int, int]]) -> None:
        """`stores` (device block, slot) first, then `loads` (slot, device block), between the
        slots and `kv_cache` [layers, 2, blocks, block_size, kv_heads, head_dim]."""
        main = torch.cuda.current_stream(self.device) if self.stream is not None else None
        if main is not None:
            main.wait_stream(self.stream)  # the last step's loads are in place before this step reads them
        if not stores and not loads:
            return
        side = contextlib.nullcontext() if self.stream is None else torch.cuda.stream(self.stream)
        with side:
            if main is not None:
                self.stream.wait_stream(main)
            if stores:
                blocks = torch.tensor([block for block, _ in stores], device=self.device)
                gathered = kv_cache.index_select(2, blocks).movedim(2, 0).contiguous()
                if main is not None:  # the stored blocks are read: the forward pass may overwrite them
                    main.wait_event(self.stream.record_event())
                for row, (_, slot) in enumerate(stores):
                    self.slots[slot].copy_(gathered[row], non_blocking=True)
            if loads:
                staged = torch.empty((len(loads), *self.slots.shape[1:]), dtype=kv_cache.dtype, device=self.device)
                for row, (slot, _) in enumerate(loads):
                    staged[row].copy_(self.slots[slot], non_blocking=True)
                blocks = torch.tensor([block for _, block in loads], device=self.device)
                kv_cache.index_copy_(2, blocks, staged.movedim(0, 2))
