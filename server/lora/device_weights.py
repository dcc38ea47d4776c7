"""LoRAWeights: the adapters' device slots, one LoRAStack per adapted layer of the model
(qkv_proj, o_proj, gate_up_proj and down_proj of every decoder layer), allocated once at start
so that CUDA graphs keep their addresses; loading an adapter copies it into a slot. `attach`
adds a LoRALayer to each of those linear layers: it adds the products of the step's LoRABatch,
which the runner sets on the shared LoRAContext before a forward pass (None: no token of the
step has an adapter, and no LoRA op runs at all)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from argosy.kernels.lora_ops import LoRABatch, LoRAStack
from argosy.server.lora.adapter_folder import MODULES, placement
from argosy.server.lora.peft_adapter import LoRAAdapter, LoRASlice
from argosy.server.models.model_config import ModelConfig
from argosy.server.parallel.layout import WHOLE, ShardLayout

ROLES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class LoRAContext:
    """What every LoRALayer reads: the current step's batch."""

    def __init__(self) -> None:
        self.batch: LoRABatch | None = None

    @contextlib.contextmanager
    def serving(self, batch: LoRABatch | None) -> Iterator[None]:
        """`batch` for the forward pass run in the block (None: no adapter), and none after."""
        self.batch = batch
        try:
            yield
        finally:
            self.batch = None


class LoRALayer(nn.Module):
    def __init__(self, stack: LoRAStack, context: LoRAContext, op: Callable[..., None]):
        super().__init__()
        self.stack, self.context, self.op = stack, context, op

    def forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        batch = self.context.batch
        if batch is not None:
            self.op(x, out, batch, self.stack)
        return out


class LoRAWeights:
    def __init__(
        self,
        model: ModelConfig,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
        layout: ShardLayout = WHOLE,
    ):
        """`layout`: with tensor parallelism, this rank's share of the model; its slots hold the
        same share of each adapter (B's rows of the layers split by output, A's columns of those
        split by input, whose partial products the layer's all-reduce sums with its own)."""
        self.model, self.layout = model, layout
        places = self.places = placement(layout.local_config(model))
        self.rank = max_rank
        # Per role: its modules in output order, and the row where each starts.
        self.modules = {role: [m for m in MODULES if places[m][0] == role] for role in ROLES}
        self.layers: list[dict[str, LoRAStack]] = []
        for _ in range(model.num_layers):
            stacks = {}
            for role, modules in self.modules.items():
                fan_in = places[modules[0]][2]
                bounds = (*(places[m][1] for m in modules), places[modules[-1]][1] + places[modules[-1]][3])
                a = torch.zeros(max_loras, len(modules) * max_rank, fan_in, dtype=dtype, device=device)
                b = torch.zeros(max_loras, bounds[-1], max_rank, dtype=dtype, device=device)
                stacks[role] = LoRAStack(a, b, bounds)
            self.layers.append(stacks)

    @torch.no_grad()
    def load(self, slot: int, adapter: LoRAAdapter) -> None:
        """The adapter's weights into `slot`, every module it leaves alone zero there."""
        for stacks, adapted in zip(self.layers, adapter.layers):
            for role, stack in stacks.items():
                stack.a[slot].zero_()
                stack.b[slot].zero_()
                for piece in adapted.get(role, ()):
                    i = self.modules[role].index(piece.module)
                    a, b = self._share(piece)
                    rank = a.shape[0]
                    stack.a[slot, i * self.rank : i * self.rank + rank].copy_(a, non_blocking=True)
                    rows = slice(self.places[piece.module][1], self.places[piece.module][1] + b.shape[0])
                    stack.b[slot, rows, :rank].copy_(b, non_blocking=True)

    def _share(self, piece: LoRASlice) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's A and B of an adapted projection."""
        shard = self.layout.shard(f"{piece.module}.weight", self.model)
        if shard is None:
            return piece.a, piece.b
        dim, start, length = shard
        if dim == 0:
            return piece.a, piece.b[start : start + length]
        return piece.a[:, start : start + length], piece.b

    def attach(self, model: nn.Module, context: LoRAContext, op: Callable[..., None]) -> None:
        """Each adapted linear layer of `model` (a CausalLM) adds its slots' products from now on."""
        for layer, stacks in zip(model.layers, self.layers):
            owners = {"qkv_proj": layer.self_attn, "o_proj": layer.self_attn}
            for role, stack in stacks.items():
                getattr(owners.get(role, layer.mlp), role).add(LoRALayer(stack, context, op))
