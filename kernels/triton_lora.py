"""The LoRA products on the GPU, token by token: a program reads its token's slot from the step's
slot buffer (the static buffer a CUDA graph replays from), so one launch serves any mix of
adapters, and a graph captured once serves every step. Shrink: shrunk[t] = A[slot] x[t], for
every slice at once (A holds the slices' ranks side by side), in float32. Expand: each output
row of token t adds B[slot][row] . shrunk[t][its slice's ranks], into the layer's output in
place. A token of the base model (slot -1) returns at once. lora_ops.lora_reference is the
definition both are tested against (in the interpreter on CPU)."""

from __future__ import annotations

import torch

from argosy.kernels.lora_ops import LoRABatch, LoRAStack
from argosy.kernels.triton_runtime import rounded, tl, triton
from argosy.kernels.triton_variants import launched

BLOCK_K = 128  # input features a shrink program reduces at a time
BLOCK_OUT = 64  # output rows an expand program writes


@launched
@triton.jit(do_not_specialize=["stride_x"])
def _lora_shrink_kernel(
    x_ptr, slots_ptr, a_ptr, shrunk_ptr, stride_x,
    FAN_IN: tl.constexpr, NR: tl.constexpr, NR_PAD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    if slot >= 0:
        r = tl.arange(0, NR_PAD)
        acc = tl.zeros([NR_PAD], dtype=tl.float32)
        for k0 in range(0, FAN_IN, BLOCK):
            k = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + token * stride_x + k, mask=k < FAN_IN, other=0.0).to(tl.float32)
            tile = a_ptr + slot * (NR * FAN_IN) + r[:, None] * FAN_IN + k[None, :]
            a = tl.load(tile, mask=(r < NR)[:, None] & (k < FAN_IN)[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(a * x[None, :], axis=1)
        tl.store(shrunk_ptr + token * NR + r, acc, mask=r < NR)


@launched
@triton.jit(do_not_specialize=["stride_out"])
def _lora_expand_kernel(
    shrunk_ptr, slots_ptr, b_ptr, out_ptr, stride_out,
    OUT: tl.constexpr, RANK: tl.constexpr, RANK_PAD: tl.constexpr, NR: tl.constexpr,
    BOUND1: tl.constexpr, BOUND2: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    if slot >= 0:
        rows = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        r = tl.arange(0, RANK_PAD)
        row_mask = rows < OUT
        mask = row_mask[:, None] & (r < RANK)[None, :]
        piece = (rows >= BOUND1).to(tl.int32) + (rows >= BOUND2).to(tl.int32)  # each row's slice
        s = tl.load(shrunk_ptr + token * NR + piece[:, None] * RANK + r[None, :], mask=mask, other=0.0)
        b = tl.load(b_ptr + slot * (OUT * RANK) + rows[:, None] * RANK + r[None, :], mask=mask, other=0.0)
        added = tl.sum(b.to(tl.float32) * s, axis=1)
        dst = out_ptr + token * stride_out + rows
        y = tl.load(dst, mask=row_mask, other=0.0).to(tl.float32)
        tl.store(dst, rounded(y + added, out_ptr.dtype.element_ty), mask=row_mask)


def shrink_constexprs(fan_in: int, nr: int) -> dict:
    return dict(
        FAN_IN=fan_in, NR=nr, NR_PAD=triton.next_power_of_2(nr), BLOCK=min(BLOCK_K, triton.next_power_of_2(fan_in))
    )


def expand_constexprs(out: int, rank: int, nr: int, bounds: tuple[int, ...]) -> dict:
    inner = (*bounds[1:-1], out, out)  # fewer than three slices: the missing bounds lie past every row
    return dict(
        OUT=out, RANK=rank, RANK_PAD=triton.next_power_of_2(rank), NR=nr, BOUND1=inner[0], BOUND2=inner[1],
        BLOCK=BLOCK_OUT,
    )  # fmt: skip


def lora(x: torch.Tensor, out: torch.Tensor, batch: LoRABatch, stack: LoRAStack) -> None:
    """Adds every token's adapter product into `out` [tokens, out] in place."""
    tokens = x.shape[0]
    if tokens == 0:
        return
    if x.stride(-1) != 1:
        x = x.contiguous()
    nr, fan_in = stack.a.shape[1], stack.a.shape[2]
    shrunk = torch.empty(tokens, nr, dtype=torch.float32, device=x.device)
    slots = batch.token_slots
    _lora_shrink_kernel[(tokens,)](x, slots, stack.a, shrunk, x.stride(0), **shrink_constexprs(fan_in, nr))
    rows = out.shape[1]
    _lora_expand_kernel[(tokens, triton.cdiv(rows, BLOCK_OUT))](
        shrunk, slots, stack.b, out, out.stride(0), **expand_constexprs(rows, stack.rank, nr, stack.bounds)
    )
