"""Speculative decoding's counters, as vLLM names them: verifications, draft tokens proposed,
and kept (in all, and by position in the draft, whose fall-off shows how long a draft pays).
The engine reports cumulative totals; the counters advance by the difference. Their series
appear once the engine speculates, as vLLM's do."""

from __future__ import annotations

from collections.abc import Callable

from argosy.server.spec_decode.speculator import SpecDecodeStats

NAMES = {
    "argosy_spec_decode_num_drafts_total": "vllm:spec_decode_num_drafts_total",
    "argosy_spec_decode_num_draft_tokens_total": "vllm:spec_decode_num_draft_tokens_total",
    "argosy_spec_decode_num_accepted_tokens_total": "vllm:spec_decode_num_accepted_tokens_total",
    "argosy_spec_decode_num_accepted_tokens_per_pos_total": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
}


class SpecDecodeMetrics:
    def __init__(self, counter: Callable, model_name: str):
        """`counter(name, doc, extra_labels, vllm_name)` makes a counter under both names."""
        self.model_name = model_name

        def twins(name: str, doc: str, extra: tuple[str, ...] = ()):
            return counter(name, doc, extra, NAMES[name])

        self.drafts = twins("argosy_spec_decode_num_drafts_total", "Drafts verified")
        self.draft_tokens = twins("argosy_spec_decode_num_draft_tokens_total", "Draft tokens proposed and verified")
        self.accepted = twins("argosy_spec_decode_num_accepted_tokens_total", "Draft tokens accepted")
        self.per_pos = twins(
            "argosy_spec_decode_num_accepted_tokens_per_pos_total",
            "Draft tokens accepted, by their position in the draft",
            ("position",),
        )
        self._last = SpecDecodeStats()

    def sync(self, stats: SpecDecodeStats) -> None:
        last = self._last
        for metric, value, before in (
            (self.drafts, stats.num_drafts, last.num_drafts),
            (self.draft_tokens, stats.num_draft_tokens, last.num_draft_tokens),
            (self.accepted, stats.num_accepted_tokens, last.num_accepted_tokens),
        ):
            if value > before:
                metric.labels(model_name=self.model_name).inc(value - before)
        before_pos = last.accepted_per_pos + [0] * (len(stats.accepted_per_pos) - len(last.accepted_per_pos))
        for position, (value, before) in enumerate(zip(stats.accepted_per_pos, before_pos)):
            if value > before:
                self.per_pos.labels(model_name=self.model_name, position=str(position)).inc(value - before)
        self._last = stats
