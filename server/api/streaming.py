"""From the engine's deltas to what a client reads: per-choice chunks (text, tokens, logprobs
and their text offsets) and the server-sent events of a streamed call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from argosy.server.api.error_responses import sse_error
from argosy.server.api.generation import Generation
from argosy.server.outputs import CompletionOutput, Logprob

SSE_DONE = "data: [DONE]\n\n"


@dataclass
class Delta:
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None
    offset: int = 0  # text_offset of this delta's first token (legacy completions logprobs)


def token_chars(token_id: int, entry: dict[int, Logprob]) -> int:
    """Characters a token adds to the text offsets; a partial character (bytes:...) adds none."""
    text = entry[token_id].decoded_token or ""
    return 0 if text.startswith("bytes:") else len(text)


@dataclass
class DeltaTracker:
    """Per choice already started: the text offset of its next token, and whether it finished
    (later outputs repeat a finished choice's reason)."""

    sent: dict[int, tuple[int, bool]] = field(default_factory=dict)

    def delta(self, index: int, choice: CompletionOutput, prefix: str = "") -> Delta | None:
        """The chunk of one choice's delta; its first carries `prefix` (the echoed prompt)."""
        started = index in self.sent
        offset, finished = self.sent.get(index, (len(prefix), False))
        if finished or (started and not choice.text and not choice.token_ids and not choice.finish_reason):
            return None
        logprobs = choice.logprobs
        end = offset + sum(token_chars(t, e) for t, e in zip(choice.token_ids, logprobs or []))
        self.sent[index] = (end, choice.finish_reason is not None)
        text = choice.text if started else prefix + choice.text
        return Delta(text, choice.token_ids, logprobs, choice.finish_reason, choice.stop_reason, offset)


def top_k(entry: dict[int, Logprob], k: int) -> list[tuple[int, Logprob]]:
    """The k most likely (token id, logprob) of one logprobs entry, best first."""
    return sorted(
        ((t, lp) for t, lp in entry.items() if lp.rank is not None and lp.rank <= k), key=lambda item: item[1].rank
    )


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def stream_events(
    gen: Generation,
    n: int,
    chunk: Callable[[int, Delta], dict],
    usage_chunk: Callable[[dict], dict] | None,
    preamble: list[dict] = (),
    prefix: Callable[[int], str] = lambda prompt_index: "",
) -> AsyncIterator[str]:
    """The SSE body of a streamed call: one chunk per choice per step with something new,
    then usage if asked for, then [DONE]. An error mid-stream becomes an error event."""
    tracker = DeltaTracker()
    try:
        version = {"weight_version": gen.weight_version}  # in every chunk, as in a whole body
        for payload in preamble:
            yield sse(payload | version)
        async for prompt_index, output in gen.outputs():
            for choice in output.outputs:
                index = prompt_index * n + choice.index
                delta = tracker.delta(index, choice, prefix(prompt_index))
                if delta is not None:
                    yield sse(chunk(index, delta) | version)
        if usage_chunk is not None:
            yield sse(usage_chunk(gen.usage()) | version)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        yield sse_error(exc)
    yield SSE_DONE
