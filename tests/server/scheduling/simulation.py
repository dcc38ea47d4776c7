"""A scheduler driven without a model: each step's tokens count as computed, a sequence's next
token is appended once its tokens are all in the cache, and it finishes after max_tokens. With
`host_blocks`, prefix caching and a host tier of that many blocks are on."""

from __future__ import annotations

import itertools

from argosy.server.engine.kv_cache_manager import KVCacheManager
from argosy.server.engine.request_options import RequestOptions
from argosy.server.engine.scheduler import Scheduler
from argosy.server.engine.sequence import Request, Sequence
from argosy.server.kv_connector.output import KVConnectorOutput
from argosy.server.kv_tier.tier_scheduler import HostTierScheduler
from argosy.server.sampling_params import SamplingParams

BLOCK = 4


class Simulation:
    def __init__(
        self,
        policy: str,
        num_blocks: int = 64,
        max_num_seqs: int = 4,
        max_num_batched_tokens: int = 64,
        host_blocks: int = 0,
    ):
        host = HostTierScheduler(host_blocks, BLOCK) if host_blocks else None
        self.kv = KVCacheManager(num_blocks, BLOCK, enable_prefix_caching=host is not None, connector=host)
        self.scheduler = Scheduler(self.kv, max_num_seqs, max_num_batched_tokens, True, policy=policy)
        self._ids = itertools.count()
        self.admitted_at: dict[str, int] = {}  # request id: the step it first ran
        self.finished_at: dict[str, int] = {}
        self.served: dict[str | None, int] = {}  # output tokens per user

    def add(
        self,
        name: str,
        prompt_len: int,
        max_tokens: int,
        priority: int = 0,
        user: str | None = None,
        prompt: list[int] | None = None,
    ) -> Sequence:
        """`prompt`: its tokens (else `prompt_len` sevens)."""
        prompt = prompt if prompt is not None else [7] * prompt_len
        request = Request(
            name, prompt, SamplingParams(max_tokens=max_tokens), options=RequestOptions(None, priority, user)
        )
        seq = Sequence(next(self._ids), request, 0, request.prompt_token_ids)
        request.seqs.append(seq)
        self.scheduler.add(seq)
        return seq

    def step(self) -> list[Sequence]:
        """One step; returns the sequences it ran."""
        out = self.last = self.scheduler.schedule()
        assert sum(item.num_new_tokens for item in out.scheduled) <= self.scheduler.max_num_batched_tokens
        assert len(self.scheduler.running) <= self.scheduler.max_num_seqs
        self.scheduler.advance(out)
        if out.kv_connector is not None:  # the worker half makes the host tier's copies in their step
            self.scheduler.kv_loads_done(KVConnectorOutput(out.kv_connector.load_seqs))
        for item in out.scheduled:
            seq = item.seq
            self.admitted_at.setdefault(seq.request.request_id, self.scheduler.steps)
            if item.completes:
                seq.token_ids.append(1)
                self.served[seq.request.user] = self.served.get(seq.request.user, 0) + 1
                if seq.num_output_tokens >= seq.params.max_tokens:
                    self.scheduler.finish(seq)
                    self.finished_at[seq.request.request_id] = self.scheduler.steps
        return [item.seq for item in out.scheduled]

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
