"""A trace: when each request arrives and how many tokens it brings and asks for. Read from the
CSV of Azure's public LLM inference traces (`TIMESTAMP,ContextTokens,GeneratedTokens`; the
timestamp a date and time, or seconds) and written in the same format, seconds from the start."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True)
class TraceRequest:
    time: float  # seconds from the trace's start
    prompt_tokens: int
    output_tokens: int


def read_trace(path: str | Path) -> list[TraceRequest]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: a trace needs the columns {', '.join(COLUMNS)}; missing {', '.join(missing)}")
        rows = []
        for line, row in enumerate(reader, start=2):
            try:
                when = _seconds(row["TIMESTAMP"])
                prompt, output = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except ValueError as exc:
                raise ValueError(f"{path}, line {line}: {exc}") from None
            if prompt < 1 or output < 0:
                raise ValueError(
                    f"{path}, line {line}: ContextTokens must be at least 1 and GeneratedTokens at least 0"
                )
            rows.append((when, prompt, output))
    if not rows:
        raise ValueError(f"{path}: the trace has no requests")
    rows.sort()
    start = rows[0][0]
    # A request that asks for no tokens still gets one: the engine samples at least one.
    return [TraceRequest(when - start, prompt, max(output, 1)) for when, prompt, output in rows]


def write_trace(path: str | Path, requests: list[TraceRequest]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for r in requests:
            writer.writerow([f"{r.time:.6f}", r.prompt_tokens, r.output_tokens])


def _seconds(stamp: str) -> float:
    try:
        return float(stamp)
    except ValueError:
        pass
    # Azure's timestamps carry 7 fractional digits, more than fromisoformat takes before 3.11's.
    head, _, fraction = stamp.strip().partition(".")
    whole = datetime.fromisoformat(head)
    return whole.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)
