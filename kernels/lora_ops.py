"""The LoRA products of a step in PyTorch: for every token whose sequence has an adapter, an
adapted layer adds x @ A^T @ B^T of that adapter's device slot to the layer's output.

One fused layer's adapters are held as a LoRAStack: `a` [slots, slices * rank, in] holds each
slice's A stacked along the rank (q, k, v of qkv_proj; gate, up of gate_up_proj), `b`
[slots, out, rank] each output row's B (the rows of one slice read that slice's rank columns
of the shrunk vector), `bounds` the slices' output rows (q: 0..bounds[1], k: ..bounds[2], ...).
Ranks below the stack's are zero-padded, and modules an adapter leaves alone are zero.

A step's tokens reach the op as a LoRABatch: the slot of each token on the device (-1: the base
model), and the same as runs of one slot over consecutive tokens on the host. `lora_reference`
is the definition, token by token; `lora_runs` computes it a run at a time (shrink, then expand
into each slice's rows), which on CPU, where the runner puts a step's sequences in slot order,
is one pair of matrix products per adapter in the step."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoRAStack:
    a: torch.Tensor  # [slots, slices * rank, in]
    b: torch.Tensor  # [slots, out, rank], scaled
    bounds: tuple[int, ...]  # output rows of the slices: slice i is bounds[i]..bounds[i + 1]

    @property
    def rank(self) -> int:
        return self.b.shape[-1]


@dataclass(frozen=True)
class LoRABatch:
    token_slots: torch.Tensor  # [tokens] on the device: each token's slot, -1 for none
    runs: list[tuple[int, int, int]]  # (slot, first token, end) of consecutive tokens of one slot (slots >= 0 only)

    @functools.cached_property
    def run_table(self) -> torch.Tensor:
        """The runs as int64 [runs, 3] on the host, built once a step for every layer's kernel."""
        return torch.tensor(self.runs, dtype=torch.long).reshape(-1, 3)


def lora_reference(x: torch.Tensor, out: torch.Tensor, token_slots: torch.Tensor, stack: LoRAStack) -> None:
    """out[t] += B[slot] (A[slot] x[t]) for every token t with a slot, slice by slice, in float32."""
    rank = stack.rank
    for t, slot in enumerate(token_slots.tolist()):
        if slot < 0:
            continue
        shrunk = stack.a[slot].float() @ x[t].float()
        for i, (lo, hi) in enumerate(zip(stack.bounds, stack.bounds[1:])):
            added = stack.b[slot, lo:hi].float() @ shrunk[i * rank : (i + 1) * rank]
            out[t, lo:hi] = (out[t, lo:hi].float() + added).to(out.dtype)


def lora_runs(x: torch.Tensor, out: torch.Tensor, batch: LoRABatch, stack: LoRAStack) -> None:
    """lora_reference, a run of one adapter's tokens at a time."""
    rank, bounds = stack.rank, stack.bounds
    for slot, start, end in batch.runs:
        shrunk = x[start:end] @ stack.a[slot].T
        rows = out[start:end]
        for i in range(len(bounds) - 1):
            rows[:, bounds[i] : bounds[i + 1]].addmm_(
                shrunk[:, i * rank : (i + 1) * rank], stack.b[slot, bounds[i] : bounds[i + 1]].T
            )
