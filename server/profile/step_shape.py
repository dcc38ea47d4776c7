"""StepShape: what a step's cost depends on, read off its StepPlan: the prompt tokens it computes
(and how much earlier context they attend to), the sequences it decodes (and the context they
read), and the rows it samples. The profile times steps by these; the simulator prices its steps
with them."""

from __future__ import annotations

from dataclasses import astuple, dataclass

from argosy.server.executor.plan import StepPlan

FEATURES = ("steps", "prefill_tokens", "prefill_attention", "decode_seqs", "decode_context", "samples")


@dataclass(frozen=True)
class StepShape:
    steps: int  # 1: the step's fixed cost (its launch, its Python, the layers' calls)
    prefill_tokens: int  # tokens of chunks longer than one token, or a prompt's first
    prefill_attention: float  # thousands of (query, key) pairs the prefill chunks attend
    decode_seqs: int  # one-token chunks past the first position
    decode_context: int  # KV positions those decodes read
    samples: int  # rows sampled

    @classmethod
    def of(cls, plan: StepPlan) -> StepShape:
        prefill = attention = decodes = context = 0
        for chunk in plan.chunks:
            n = len(chunk.token_ids)
            if n == 1 and chunk.start > 0:
                decodes += 1
                context += chunk.start + 1
            else:
                prefill += n
                attention += n * (chunk.start + (n + 1) / 2) / 1000
        return cls(1, prefill, attention, decodes, context, len(plan.samples))

    def features(self) -> tuple[float, ...]:
        return astuple(self)
