"""What the ahead-of-time compile (sm90_compile.py) compiles and checks, importable without Triton."""

from __future__ import annotations

import re

SHARED_LIMIT = 232448  # bytes of shared memory a Hopper block may use (227 KiB)
# Models' attention shapes: (name, heads, kv heads, head dim); groups of 1 (MHA) to 8.
SHAPES = [("head64-gqa3", 9, 3, 64), ("head80-mha", 32, 32, 80), ("head96-gqa4", 32, 8, 96),
          ("head128-gqa8", 64, 8, 128), ("head256-gqa2", 16, 8, 256)]  # fmt: skip
BLOCK_SIZES = (16, 32)


def cache_offset_widths(ttir: str, cache_args: tuple[str, ...]) -> list[str]:
    """The integer types of every offset added to a pointer derived from the cache arguments:
    each must be i64 (an H200's cache holds more elements than an int32 counts)."""
    derived = {f"%{a}" for a in cache_args}
    widths = []
    for line in ttir.splitlines():
        m = re.match(r"\s*(%[\w.]+) = tt\.(splat|broadcast|addptr|expand_dims|reshape) (%[\w.]+)(.*)", line)
        if not m or m.group(3) not in derived:
            continue
        derived.add(m.group(1))
        if m.group(2) == "addptr":
            widths.append(re.findall(r"i(\d+)>?\s*loc", m.group(4))[-1] if "loc" in m.group(4) else "?")
    return [f"i{w}" for w in widths]
