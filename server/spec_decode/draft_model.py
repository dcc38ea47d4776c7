"""DraftModel: the device side of draft-model speculation. A smaller checkpoint with the target's
vocabulary runs beside it, with a paged KV cache of its own laid out as the target's: the same
block ids and the same block tables, so the scheduler's one allocation (prefix hits, copies on
write, preemption) serves both. Every step's chunks run through it too (`mirror`), so that its
cache holds whatever the target's holds; after sampling, it proposes the next tokens of each
sequence asked for, greedily, one token of every sequence per pass (`propose`). Its proposals
write slots past the kept tokens, which the scheduler set aside (lookahead); the next step
writes them again with the tokens it computes. It proposes without probabilities, so
verification counts q = 1 on each draft token (lossless all the same)."""

from __future__ import annotations

import dataclasses

import msgspec
import torch

from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.model_config import ModelConfig
from argosy.server.worker.block_tables import BlockTables
from argosy.server.worker.memory_budget import kv_bytes_per_block
from argosy.server.worker.model_runner import ModelRunner
from argosy.server.worker.step_inputs import SequenceChunk

FIELD = "speculative_config.model"


@dataclasses.dataclass(frozen=True)
class ProposalStart:
    """Where one sequence's proposal begins: its last kept token, at `position`."""

    token_id: int
    position: int
    block_table: list[int]
    table_row: int
    num_tokens: int  # asked for; fewer where the block table has no slot for them


class DraftModel:
    def __init__(
        self,
        path: str,
        target: ModelConfig,
        config: EngineConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_model_len: int,
    ):
        try:
            cfg = ModelConfig.from_folder(path)
        except Exception as exc:  # a missing folder, an unsupported architecture: named as the flag's
            raise InvalidRequestError(f"{FIELD} {path!r} cannot be served: {exc}", param=FIELD) from exc
        if cfg.vocab_size != target.vocab_size:
            raise InvalidRequestError(
                f"{FIELD} has a vocabulary of {cfg.vocab_size} tokens; the target model's has {target.vocab_size}",
                param=FIELD,
            )
        # Adapters belong to the target: the draft proposes for every request from its base weights.
        config = dataclasses.replace(config, enable_lora=False)
        self.runner = ModelRunner(cfg, config, dtype, device, max_model_len)
        self.block_size = config.block_size

    def block_bytes(self) -> int:
        return kv_bytes_per_block(self.runner.cfg, self.block_size, self.runner.dtype)

    def mirror(self, chunks: list[SequenceChunk], block_copies: list[tuple[int, int]], tables: BlockTables) -> None:
        """The step's tokens into the draft's cache (its copies on write first); no logits."""
        unsampled = [msgspec.structs.replace(c, sample=False, num_draft=0) for c in chunks]
        self.runner.execute(unsampled, block_copies, tables)

    def propose(self, starts: list[ProposalStart], tables: BlockTables) -> list[list[int]]:
        """Each start's next tokens, greedily: one pass per token, of every sequence still
        proposing, each writing its input token's K/V at its position."""
        capacity = [len(s.block_table) * self.block_size - s.position for s in starts]
        lengths = [max(0, min(s.num_tokens, room)) for s, room in zip(starts, capacity)]
        drafts: list[list[int]] = [[] for _ in starts]
        inputs = [s.token_id for s in starts]
        for step in range(max(lengths, default=0)):
            live = [i for i, n in enumerate(lengths) if step < n]
            chunks = [
                SequenceChunk([inputs[i]], starts[i].position + step, starts[i].block_table, True, starts[i].table_row)
                for i in live
            ]
            next_ids = self.runner.execute(chunks, [], tables).argmax(dim=-1).tolist()
            for i, token_id in zip(live, next_ids):
                drafts[i].append(token_id)
                inputs[i] = token_id
        return drafts
