"""The n-gram proposer against a brute-force search of the same rule, on any token stream."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.server.spec_decode.ngram import NgramIndex


def brute_force(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    for n in range(max_n, min_n - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # latest earlier occurrence first
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=60),  # a small alphabet: many repeats
    st.integers(1, 4),
    st.integers(0, 3),
    st.integers(1, 6),
    st.integers(1, 5),
)
def test_the_index_proposes_what_a_search_finds_as_tokens_arrive(tokens, min_n, extra, k, pieces):
    index = NgramIndex(min_n, min_n + extra)
    step = max(1, len(tokens) // pieces)
    for end in range(0, len(tokens), step):
        index.extend(tokens[end : end + step])
        seen = tokens[: end + step]
        assert index.propose(k) == brute_force(seen, min_n, min_n + extra, k)


def test_the_longest_match_wins_and_its_latest_occurrence():
    index = NgramIndex(1, 3)
    index.extend([7, 1, 2, 3, 9, 8, 2, 3, 5, 1, 2, 3])
    assert index.propose(2) == [9, 8]  # [1, 2, 3] (3 tokens) beats [2, 3] followed by 5
    index = NgramIndex(2, 2)
    index.extend([4, 5, 6, 4, 5, 7, 4, 5])
    assert index.propose(1) == [7]  # the later of the two earlier [4, 5]
    assert NgramIndex(2, 3).propose(3) == []
