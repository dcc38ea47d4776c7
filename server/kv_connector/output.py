"""KVConnectorOutput: what a connector's worker half reports in a step's result."""

from __future__ import annotations

import msgspec


class KVConnectorOutput(msgspec.Struct, array_like=True):
    """What the worker half reports in a step's result."""

    finished_loads: list[int] = []  # sequences whose loads have all finished (they compute from the next step)
    failed_blocks: list[int] = []  # device blocks whose load failed (their sequences compute them again)
    finished_sends: list[str] = []  # requests whose held blocks another replica has pulled
    lent: list[str] = []  # requests whose held blocks a NIXL read is taking (held until it says it is done)
    refused: list[tuple[int, str]] = []  # (sequence, why): its load was refused (the request's fault)
    cancels_done: list[int] = []  # sequences that left while loading whose transfers have now ended
    blocks_pulled: int = 0  # since the last report, in and out
    blocks_sent: int = 0
    bytes_moved: int = 0
    seconds: float = 0.0  # the pulls' wall time
    pulls_failed: int = 0
