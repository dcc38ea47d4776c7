"""One streamed OpenAI call timed as a client sees it: time to the first token, the gaps between
tokens (each content chunk one token: the server streams a chunk per token), and the text."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from itertools import pairwise

import httpx


@dataclass
class Timing:
    ttft: float
    itl: list[float]
    text: str


async def stream(client: httpx.AsyncClient, url: str, body: dict) -> Timing | None:
    """None when the call failed (an HTTP error or a status other than 200)."""
    sent, times, pieces = time.perf_counter(), [], []
    try:
        async with client.stream("POST", url, json={**body, "stream": True}) as response:
            if response.status_code != 200:
                await response.aread()
                return None
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[6:])["choices"][0]
                piece = choice["delta"].get("content") if "delta" in choice else choice.get("text")
                if piece:
                    times.append(time.perf_counter())
                    pieces.append(piece)
    except httpx.HTTPError:
        return None
    if not times:
        return None
    return Timing(times[0] - sent, [b - a for a, b in pairwise(times)], "".join(pieces))
