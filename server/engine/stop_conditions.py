"""When a sequence ends, judged in tokens by the engine core: eos, a stop token, max_tokens,
max_model_len. Stop strings need text, so the API process judges those (OutputProcessor)."""

from __future__ import annotations

from argosy.server.engine.sequence import Sequence


def finish_reason(
    seq: Sequence, token_id: int, eos_token_ids: frozenset[int], max_model_len: int
) -> tuple[str | None, int | None]:
    """(finish_reason, stop_reason) after `token_id` was appended to `seq`; (None, None) while
    it goes on. eos and stop tokens count only once min_tokens are out."""
    p = seq.params
    num_tokens = len(seq.token_ids)  # this runs for every sequence at every step: no properties
    num_output = num_tokens - seq.num_prompt_tokens
    may_stop = p.may_stop(num_output)
    if may_stop and not p.ignore_eos and token_id in eos_token_ids:
        return "stop", None
    if may_stop and token_id in p.stop_token_ids:
        return "stop", token_id
    if (p.max_tokens is not None and num_output >= p.max_tokens) or num_tokens >= max_model_len:
        return "length", None
    return None, None
