"""What the device side keeps of each sequence between steps, as the step plans describe them:
its block table, its sampling parameters and seeded generator, and its tokens (penalties read
them). The engine names a sequence once (NewSequence), sends only the changes of its block
table, and says when it may be forgotten."""

from __future__ import annotations

import torch

from argosy.server.executor.plan import NewSequence, StepPlan
from argosy.server.sampling_params import SamplingParams

CPU = torch.device("cpu")


class SequenceState:
    __slots__ = (
        "block_table",
        "generator",
        "output_token_ids",
        "params",
        "penalized",
        "prompt_token_ids",
        "request_id",
    )

    def __init__(
        self,
        request_id: str,
        params: SamplingParams,
        prompt_token_ids: list[int],
        seed: int | None,
        device: torch.device = CPU,
    ):
        self.request_id, self.params = request_id, params
        self.penalized = params.has_penalties  # read for every row at every step
        self.prompt_token_ids = prompt_token_ids
        self.output_token_ids: list[int] = []
        self.block_table: list[int] = []
        # Each sequence draws from its own stream, as in vLLM: the request's seed + its index. The
        # generator lives where the logits do, so that its noise is drawn there.
        self.generator = None if seed is None else torch.Generator(device).manual_seed(seed)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


class SequenceStates(dict[int, SequenceState]):
    """Every sequence the device side knows, by id."""

    def __init__(self, device: torch.device = CPU):
        super().__init__()
        self.device = device

    def apply(self, plan: StepPlan) -> None:
        """Takes in what the plan says changed before its step runs."""
        for seq_id in plan.finished:
            self.pop(seq_id, None)
        for new in plan.new_sequences:
            self[new.seq_id] = self._state(new)
        for chunk in plan.chunks:
            if chunk.blocks is not None:
                kept, added = chunk.blocks
                table = self[chunk.seq_id].block_table
                del table[kept:]
                table += added

    def _state(self, new: NewSequence) -> SequenceState:
        prompt = new.prompt_token_ids if new.fork_of is None else self[new.fork_of].prompt_token_ids
        return SequenceState(new.request_id, new.params, prompt, new.seed, self.device)
