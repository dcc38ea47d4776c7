"""The node's quota: what to evict to make room for a copy, or why it cannot fit. A pure
function of the copies held; the rules, in order:

1. Copies no ModelCache wants on the node any more (deleted, or no longer selecting it) go
   first, least recently used first. They stay until the room is needed: a ModelCache applied
   again finds its copy still there.
2. For a pinned ModelCache, then copies of unpinned ones, least recently used first.
3. Never a copy a pod on the node uses, a pinned one, or one being copied.

What does not fit after that waits, with the numbers, rather than failing midway: an unpinned
copy never evicts a wanted one, so two copies never evict each other in turn."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HeldCopy:
    key: str  # "namespace/name"
    size: int  # bytes on the disk
    last_used: float  # when a pod on the node last used it, or when it became ready
    wanted: bool  # its ModelCache exists and selects the node
    pinned: bool = False
    in_use: bool = False  # a pod on the node mounts it
    busy: bool = False  # being copied or verified


@dataclass(frozen=True)
class Room:
    evict: list[str]  # keys, in order
    fits: bool
    message: str = ""  # why it does not fit


def make_room(held: list[HeldCopy], size: int, pinned: bool, quota: int) -> Room:
    """What to evict so that `size` more bytes fit under `quota` (0: no quota)."""
    used = sum(copy.size for copy in held)
    if not quota or used + size <= quota:
        return Room([], True)
    movable = [c for c in held if not (c.in_use or c.busy or c.pinned)]
    order = sorted((c for c in movable if not c.wanted), key=lambda c: c.last_used)
    if pinned:
        order += sorted((c for c in movable if c.wanted), key=lambda c: c.last_used)
    evict = []
    for copy in order:
        if used + size <= quota:
            break
        evict.append(copy.key)
        used -= copy.size
    if used + size <= quota:
        return Room(evict, True)
    held_by = ", ".join(f"{c.key} ({_why_kept(c)})" for c in held if c.key not in evict) or "nothing"
    return Room(
        [],
        False,
        f"needs {_gb(size)}; the quota is {_gb(quota)}, of which {_gb(max(0, quota - used))} is free or could be "
        f"freed for it; held by {held_by}",
    )


def _why_kept(copy: HeldCopy) -> str:
    if copy.in_use:
        return "in use"
    if copy.busy:
        return "being copied"
    if copy.pinned:
        return "pinned"
    return f"{_gb(copy.size)}, wanted"


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB"
