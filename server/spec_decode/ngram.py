"""Prompt lookup: the next tokens of a sequence guessed from its own past. The longest suffix
of `prompt_lookup_max` down to `prompt_lookup_min` tokens that occurred before is looked up, and
the k tokens that followed its latest earlier occurrence are proposed. An index per sequence,
kept up to date as tokens arrive, makes each proposal O(max) whatever the context's length."""

from __future__ import annotations


class NgramIndex:
    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        # n-gram -> where the token after its latest occurrence is (an index into tokens)
        self._after: dict[tuple[int, ...], int] = {}

    def extend(self, token_ids: list[int]) -> None:
        for token in token_ids:
            # Each n-gram ending at the old last token becomes "seen, followed by `token`".
            end = len(self.tokens)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._after[tuple(self.tokens[end - n : end])] = end
            self.tokens.append(token)

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the longest earlier occurrence of the current suffix
        (none when no suffix of at least min_n tokens occurred before)."""
        tokens, end = self.tokens, len(self.tokens)
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            start = self._after.get(tuple(tokens[end - n : end]))
            if start is not None:
                return tokens[start : start + k]
        return []
