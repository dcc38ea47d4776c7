"""The sampler is a pipeline of logits processors: an edit added to it applies to the greedy and
the sampled rows it wants, and rows no edit wants keep the greedy fast path (their argmax taken
on the model's logits, untouched and unwidened)."""

from __future__ import annotations

import torch

from argosy.server.sampling_params import SamplingParams
from argosy.server.worker import sampler
from argosy.server.worker.sampler import Sampler
from argosy.server.worker.sequence_states import SequenceState


def state(request_id: str = "r", **params) -> SequenceState:
    p = SamplingParams(**params)
    return SequenceState(request_id, p, [0], p.seed_of(0))


class AllowOnly:
    """A mask, as a grammar's would be: only `token` may follow, for the rows of `request_ids`."""

    def __init__(self, token: int, request_ids: set[str]):
        self.token, self.request_ids = token, request_ids

    def rows(self, seqs):
        return [i for i, s in enumerate(seqs) if s.request_id in self.request_ids]

    def apply(self, logits, rows, seqs):
        keep = logits[rows, self.token].clone()
        logits[rows] = float("-inf")
        logits[rows, self.token] = keep


def test_an_added_edit_shapes_the_greedy_and_the_sampled_rows_it_wants():
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    seqs = [state("a", temperature=0), state("b", seed=1), state("c", temperature=0), state("d", seed=2)]
    plain = Sampler((9,))(logits, seqs).token_ids
    pipeline = Sampler((9,))
    pipeline.edits.append(AllowOnly(7, {"a", "b"}))
    seqs = [state("a", temperature=0), state("b", seed=1), state("c", temperature=0), state("d", seed=2)]
    masked = pipeline(logits, seqs).token_ids
    assert masked[:2] == [7, 7] and masked[2:] == plain[2:]
    assert plain[:2] != [7, 7]  # the mask changed what would have been drawn


def test_rows_no_edit_wants_take_their_argmax_on_the_models_logits(monkeypatch):
    seen: list[torch.dtype] = []
    greedy = sampler.greedy_tokens
    monkeypatch.setattr(sampler, "greedy_tokens", lambda logits: (seen.append(logits.dtype), greedy(logits))[1])
    logits = torch.randn(2, 4096).bfloat16()
    Sampler((9,))(logits, [state(temperature=0), state(temperature=0)])
    Sampler((9,))(logits, [state(temperature=0), state(temperature=0, repetition_penalty=1.2)])
    assert seen == [torch.bfloat16, torch.float32]  # widened only when an edit applies


def test_the_min_tokens_rule_is_the_params_own():
    """One rule for the sampler's ban, the core's stop check and the API's stop strings."""
    params = SamplingParams(min_tokens=3, max_tokens=8)
    assert [params.may_stop(n) for n in range(5)] == [False, False, False, True, True]
    logits = torch.zeros(1, 16)
    logits[0, 9] = 5.0  # eos, by far the likeliest
    banned = Sampler((9,))(logits, [state(temperature=0, min_tokens=3)]).token_ids
    s = state(temperature=0, min_tokens=3)
    s.output_token_ids += [1, 2, 3]
    allowed = Sampler((9,))(logits, [s]).token_ids
    assert banned != [9] and allowed == [9]
