"""The sampler's transformations, each checked against its definition on crafted logits; and a
row that cannot be sampled failing alone."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.kernels import cpu_kernels
from argosy.server.sampling_params import SamplingParams
from argosy.server.worker import sampler
from argosy.server.worker.sampler import NO_TOKEN, Sampler, greedy_tokens
from argosy.server.worker.sequence_states import SequenceState

EOS = 9


def seq(prompt=(0,), outputs=(), request_id="r", **params) -> SequenceState:
    p = SamplingParams(**params)
    s = SequenceState(request_id, p, list(prompt), p.seed_of(0))
    s.output_token_ids.extend(outputs)
    return s


def sample(logits, *seqs):
    return Sampler((EOS,))(torch.tensor(logits, dtype=torch.float32), list(seqs))


def test_greedy_takes_the_argmax():
    assert sample([[0.1, 3.0, 2.0], [5.0, 1.0, 0.0]], seq(temperature=0), seq(temperature=0)).token_ids == [1, 0]


@pytest.mark.parametrize("params", [dict(top_k=1), dict(top_p=0.05), dict(min_p=1.0)])
def test_truncation_to_one_candidate_is_deterministic(params):
    logits = [[1.0, 2.5, 2.4, 0.0]] * 64
    seqs = [seq(temperature=5.0, **params) for _ in range(64)]
    assert set(sample(logits, *seqs).token_ids) == {1}


def test_top_k_and_top_p_keep_exactly_the_allowed_tokens():
    logits = [[math.log(p) for p in (0.5, 0.3, 0.15, 0.05)]] * 400
    seen_k = set(sample(logits, *[seq(top_k=2, seed=i) for i in range(400)]).token_ids)
    seen_p = set(sample(logits, *[seq(top_p=0.8, seed=i) for i in range(400)]).token_ids)
    assert seen_k == {0, 1}
    assert seen_p == {0, 1}  # 0.5 + 0.3 covers 0.8: the third token is dropped


def test_top_p_applies_to_what_top_k_kept():
    # After top-k=2 the two survivors weigh 4/7 and 3/7; top-p=0.5 keeps only the first.
    logits = [[math.log(p) for p in (0.4, 0.3, 0.1, 0.1, 0.1)]] * 300
    assert set(sample(logits, *[seq(top_k=2, top_p=0.5, seed=i) for i in range(300)]).token_ids) == {0}


def test_sampling_follows_the_distribution():
    probs = (0.6, 0.3, 0.1)
    logits = [[math.log(p) for p in probs]] * 6000
    tokens = sample(logits, *[seq(seed=i) for i in range(6000)]).token_ids
    for token, p in enumerate(probs):
        assert abs(tokens.count(token) / 6000 - p) < 0.03


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    # Token 0 (in the prompt) falls from 2.0 to 1.0; token 2 (generated) from -0.5 to -1.0.
    s = seq(prompt=[0], outputs=[2], temperature=0, repetition_penalty=2.0)
    assert sample([[2.0, 1.5, -0.5]], s).token_ids == [1]
    s = seq(prompt=[0], outputs=[2], temperature=0, repetition_penalty=2.0)
    assert sample([[-3.0, -0.9, -0.5]], s).token_ids == [1]


def test_frequency_and_presence_penalties_count_output_tokens_only():
    # Token 0 was generated 3 times: frequency 0.5 lowers it by 1.5, to 0.5 < 1.0.
    assert sample([[2.0, 1.0]], seq(outputs=[0, 0, 0], temperature=0, frequency_penalty=0.5)).token_ids == [1]
    assert sample([[2.0, 1.0]], seq(outputs=[0], temperature=0, frequency_penalty=0.5)).token_ids == [0]
    assert sample([[2.0, 1.0]], seq(outputs=[0], temperature=0, presence_penalty=1.5)).token_ids == [1]
    # The prompt's tokens are not penalised by presence or frequency.
    assert sample([[2.0, 1.0]], seq(prompt=[0, 0, 0], temperature=0, presence_penalty=1.5)).token_ids == [0]


def test_logit_bias_is_added_before_the_penalties_as_vllm_orders_them():
    torch.manual_seed(0)
    logits = torch.randn(3, 12) * 3
    bias = {1: 4.0, 4: -3.0, 7: 2.5}
    rows = [
        seq(prompt=(4,), outputs=(7, 7), logit_bias=bias, repetition_penalty=1.3, frequency_penalty=0.5),
        seq(logit_bias={0: -1.0, 11: 0.25}),
        seq(),
    ]
    edited = logits.clone()
    for edit in Sampler((EOS,)).edits:  # in the sampler's order
        if chosen := edit.rows(rows):
            edit.apply(edited, chosen, rows)
    reference = logits.clone()
    for token, value in bias.items():
        reference[0, token] += value
    for token in (4, 7):  # repetition: over the prompt and the output, on the biased logits
        value = reference[0, token]
        reference[0, token] = value / 1.3 if value > 0 else value * 1.3
    reference[0, 7] -= 0.5 * 2  # frequency: twice in the output
    reference[1, 0] -= 1.0
    reference[1, 11] += 0.25
    torch.testing.assert_close(edited, reference)
    # Greedy, the bias alone decides: the banned token never wins, the favoured one does.
    assert sample([[9.0, 1.0, 0.0]], seq(temperature=0, logit_bias={0: -100.0, 2: 5.0})).token_ids == [2]


def test_min_tokens_bans_eos_and_stop_tokens_until_reached():
    logits = [[0.0] * 9 + [10.0, 9.0]]  # eos (9) first, stop token 10 second
    assert sample(logits, seq(temperature=0, min_tokens=2, stop_token_ids=[10])).token_ids == [0]
    assert sample(logits, seq(outputs=[1, 1], temperature=0, min_tokens=2)).token_ids == [9]


def test_logprobs_are_the_raw_distribution_with_rank_and_alternatives():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5]])
    out = Sampler((EOS,))(logits, [seq(temperature=0, logprobs=2, repetition_penalty=5.0, prompt=[1])])
    expected = torch.log_softmax(logits, -1)[0]
    lp = out.logprobs[0]
    assert lp.token_id == 2 and lp.rank == 2  # the penalty moved the choice, not the reported distribution
    assert lp.logprob == pytest.approx(expected[2].item())
    assert [t for t, _ in lp.top] == [1, 2]
    assert [v for _, v in lp.top] == pytest.approx([expected[1].item(), expected[2].item()])


def test_seeded_rows_ignore_their_neighbours():
    logits = torch.randn(1, 50).repeat(5, 1)
    alone = sample(logits[:1].tolist(), seq(seed=42)).token_ids[0]
    mixed = sample(logits.tolist(), seq(), seq(seed=1), seq(seed=42), seq(temperature=0), seq()).token_ids[2]
    assert alone == mixed


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 9),
    vocab=st.sampled_from([2048, 3000, 4096, 5121, 49152]),
    levels=st.integers(2, 50),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    seed=st.integers(0, 2**16),
    kernel=st.booleans(),
)
def test_greedy_tokens_are_the_first_maximum_of_each_row(rows, vocab, levels, dtype, seed, kernel):
    """Through the C++ kernel and through its PyTorch twin (the path without a compiler)."""
    assert cpu_kernels.cpu_kernels() is not None, "the kernels must build where the tests run"
    # Few distinct values make ties, the case where "first" matters.
    g = torch.Generator().manual_seed(seed)
    wide = torch.randint(-levels, levels, (rows, vocab + seed % 2), generator=g).to(dtype)
    logits = wide[:, :vocab]  # rows further apart than their length, as a slice leaves them
    if seed % 3 == 0:
        logits[:, -1] = levels  # the maximum in the short last chunk
    if seed % 5 == 0:
        logits[0] = float("-inf")  # every token banned: the first, as torch.argmax
        logits[-1, 7 * vocab // 8 :] = float("-inf")
    with mock.patch.object(cpu_kernels, "cpu_kernels", cpu_kernels.cpu_kernels if kernel else lambda: None):
        tokens = greedy_tokens(logits)
    assert torch.equal(tokens, logits.float().argmax(dim=-1))


def test_a_row_whose_sampling_fails_fails_alone_and_the_others_keep_their_draws(monkeypatch):
    """The batch fails; each row is then sampled alone, a seeded one from its generator as it was
    before the batch (so its draw is the one it makes without the failure)."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)).tolist()

    def rows():
        return seq(temperature=0), seq(seed=3), seq(request_id="poison", seed=4)

    expected = sample(logits[:2], *rows()[:2]).token_ids
    draw = sampler.draw

    def poisoned(probs, seqs):
        drawn = draw(probs, seqs)  # the generators have moved on when it fails
        if any(s.request_id == "poison" for s in seqs):
            raise RuntimeError("injected fault")
        return drawn

    monkeypatch.setattr(sampler, "draw", poisoned)
    out = sample(logits, *rows())
    assert out.token_ids[:2] == expected and out.errors[:2] == [None, None]
    assert out.errors[2] == "sampling failed: RuntimeError: injected fault"


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
def test_rows_whose_logits_leave_no_token_to_choose_fail_alone(kernel):
    vocab = 4096  # the greedy rows go through the CPU kernel, or its PyTorch twin
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    logits[1] = float("nan")  # a forward pass that overflowed, for this sequence only
    logits[2] = float("-inf")
    logits[3] = float("nan")
    seqs = [seq(temperature=0), seq(temperature=0), seq(temperature=0), seq(seed=5), seq(seed=6)]
    with mock.patch.object(cpu_kernels, "cpu_kernels", cpu_kernels.cpu_kernels if kernel else lambda: None):
        out = Sampler((EOS,))(logits, seqs)
    assert out.errors == [None, NO_TOKEN, NO_TOKEN, NO_TOKEN, None]
    assert out.token_ids[0] == int(logits[0].float().argmax())


def test_a_sampling_step_brings_results_to_the_host_once(monkeypatch):
    """On a GPU each read of a device value on the host waits for the device. One step of a
    batch that asks for everything (penalties, min_tokens, seeds, top-k/p, min-p, logprobs) reads
    once: here, on CPU, every read of a tensor's value is counted."""
    reads: list[str] = []
    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            reads.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    logits = torch.randn(5, 4096, generator=torch.Generator().manual_seed(3)).bfloat16()
    seqs = [
        seq(temperature=0),
        seq(temperature=0, repetition_penalty=1.3, outputs=[5, 6]),
        seq(seed=1, top_k=20, top_p=0.9, logprobs=3),
        seq(seed=2, min_p=0.1, min_tokens=4),
        seq(temperature=0.7, logprobs=0),
    ]
    out = Sampler((EOS,))(logits, seqs)
    assert reads == ["tolist"] and len(out.token_ids) == 5 and out.logprobs[2] is not None
    reads.clear()
    Sampler((EOS,))(logits, seqs[:2])  # without logprobs, too
    assert reads == ["tolist"]
