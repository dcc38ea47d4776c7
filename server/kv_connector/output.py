"""KVConnectorOutput: what a connector's worker half reports in a step's result."""

from __future__ import annotations

import msgspec


class KVConnectorOutput(msgspec.Struct, array_like=True):
    """What the worker half reports in a step's result."""

    finished_loads: list[int] = []  # sequences whose loads have all finished (they compute from the next step)
    failed_blocks: list[int] = []  # device blocks whose load failed (their sequences compute them again)
