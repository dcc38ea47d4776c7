"""The step's plan from rank 0 to the other ranks: one message per step, never one per layer.
The plan goes as its MessagePack bytes over the group's CPU (gloo) channel, its length first;
a message of no bytes tells the ranks to stop."""

from __future__ import annotations

import msgspec
import torch

from argosy.server.executor.plan import StepPlan
from argosy.server.parallel.group import TensorParallel

_encoder, _decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(StepPlan)


def send_plan(plan: StepPlan | None, shards: TensorParallel) -> None:
    """On rank 0: the plan every other rank runs next (None: they stop)."""
    payload = b"" if plan is None else _encoder.encode(plan)
    shards.broadcast(torch.tensor([len(payload)], dtype=torch.int64))
    if payload:
        shards.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8))


def receive_plan(shards: TensorParallel) -> StepPlan | None:
    """On the other ranks: the next plan rank 0 sent, or None when it said stop."""
    length = torch.zeros(1, dtype=torch.int64)
    shards.broadcast(length)
    if not length.item():
        return None
    payload = torch.empty(int(length.item()), dtype=torch.uint8)
    shards.broadcast(payload)
    return _decoder.decode(payload.numpy().tobytes())
