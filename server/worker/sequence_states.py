"""What the device side keeps of each sequence between steps, as the step plans describe them:
its block table (a list on the host, for the new tokens' slots, and a row of the BlockTables on
the device), its sampling parameters and seeded generator, its tokens (penalties read them), and
with a constraint its grammar's state (from the device side's GrammarStore, on the rank that samples).
The engine names a sequence once (NewSequence), sends only the changes of its block table, and
says when it may be forgotten."""

from __future__ import annotations

import torch

from argosy.server.executor.plan import NewSequence, StepPlan
from argosy.server.sampling_params import SamplingParams
from argosy.server.structured.grammar_mask import GrammarState, Vocabulary
from argosy.server.structured.grammar_store import GrammarStore
from argosy.server.worker.block_tables import BlockTables

CPU = torch.device("cpu")


class SequenceState:
    __slots__ = (
        "block_table",
        "generator",
        "grammar",
        "lora_slot",
        "output_token_ids",
        "params",
        "penalized",
        "prompt_token_ids",
        "request_id",
        "table_row",
    )

    def __init__(
        self,
        request_id: str,
        params: SamplingParams,
        prompt_token_ids: list[int],
        seed: int | None,
        device: torch.device = CPU,
        table_row: int = -1,
        lora_slot: int = -1,
    ):
        self.request_id, self.params = request_id, params
        self.penalized = params.has_penalties  # read for every row at every step
        self.prompt_token_ids = prompt_token_ids
        self.output_token_ids: list[int] = []
        self.block_table: list[int] = []
        self.table_row = table_row  # in the device's BlockTables
        self.lora_slot = lora_slot  # its adapter's device slot; -1: the base model
        # Each sequence draws from its own stream, as in vLLM: the request's seed + its index. The
        # generator lives where the logits do, so that its noise is drawn there.
        self.generator = None if seed is None else torch.Generator(device).manual_seed(seed)
        self.grammar: GrammarState | None = None  # with a constraint: where its output stands in it

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


class SequenceStates(dict[int, SequenceState]):
    """Every sequence the device side knows, by id, and their block tables on the device."""

    def __init__(
        self,
        max_blocks_per_seq: int,
        device: torch.device = CPU,
        vocab_size: int = 0,
        eos_token_ids: tuple = (),
        grammars: GrammarStore | None = None,
    ):
        super().__init__()
        self.device = device
        self.tables = BlockTables(max_blocks_per_seq, device)
        self.vocab_size, self.eos_token_ids = vocab_size, list(eos_token_ids)
        self.grammars = grammars  # None on the ranks that do not sample
        self.vocabulary: Vocabulary | None = None  # made at the first constrained sequence

    def apply(self, plan: StepPlan) -> None:
        """Takes in what the plan says changed before its step runs."""
        tables = self.tables
        for seq_id in plan.finished:
            state = self.pop(seq_id, None)
            if state is not None:
                tables.release(state.table_row)
        for new in plan.new_sequences:
            self[new.seq_id] = self._state(new)
        for chunk in plan.chunks:
            if chunk.blocks is not None:
                kept, added = chunk.blocks
                state = self[chunk.seq_id]
                del state.block_table[kept:]
                state.block_table += added
                tables.change(state.table_row, kept, added)
        tables.flush()

    def _vocabulary(self) -> Vocabulary:
        if self.vocabulary is None:
            self.vocabulary = Vocabulary(self.grammars.vocab_bytes, self.vocab_size)
        return self.vocabulary

    def _state(self, new: NewSequence) -> SequenceState:
        parent = None if new.fork_of is None else self[new.fork_of]
        prompt = new.prompt_token_ids if parent is None else parent.prompt_token_ids
        state = SequenceState(
            new.request_id, new.params, prompt, new.seed, self.device, self.tables.add(), new.lora_slot
        )
        constraint = new.params.structured_outputs
        if parent is not None and parent.grammar is not None:
            state.grammar = parent.grammar.fork()
        elif constraint is not None and self.grammars is not None:  # ranks 1..N-1 sample nothing: no grammars
            stops = self.eos_token_ids + list(new.params.stop_token_ids)
            compiled, json = self.grammars[constraint], constraint.kind in ("json", "json_object")
            state.grammar = GrammarState.start(compiled, stops, self._vocabulary(), json)
        return state
