"""The messages between a decode replica's worker and a prefill replica's side channel (msgspec
over ZMQ). A pull names the engine and the request the blocks are held for, with the hold's token,
the blocks wanted, and the puller's block layout; the reply is refused (why, in words) or carries
the blocks' bytes in the frame after it, [layers, 2, blocks, block_size, kv_heads, head_dim] (the
cache's own order) as the layout says."""

from __future__ import annotations

import msgspec


class KVLayout(msgspec.Struct, array_like=True, frozen=True):
    """What must agree for one side's block bytes to mean the same on the other."""

    block_shape: tuple[int, ...]  # one block of every layer: [layers, 2, block_size, kv_heads, head_dim]
    dtype: str
    tp_size: int = 1

    def mismatch(self, puller: KVLayout) -> str | None:
        """Why blocks of this (the prefill side's) layout cannot be read as `puller`'s; None when they can."""
        for name in ("block_shape", "dtype", "tp_size"):
            mine, theirs = getattr(self, name), getattr(puller, name)
            if mine != theirs:
                return f"the KV layouts differ: {name} is {mine} on the prefill side, {theirs} on the decode side"
        return None


class PullRequest(msgspec.Struct, array_like=True, frozen=True):
    engine_id: str
    request_id: str
    held: list[int]  # the blocks held for the request, as its token signs them
    deadline: float  # when the hold ends (the host's monotonic clock), as signed
    token: str
    block_ids: list[int]  # those of them wanted (none: the hold is let go, nothing pulled)
    layout: KVLayout | None = None  # the puller's (its worker fills it in)
    nixl: bool = False  # the puller reads the blocks with NIXL: the reply says where they are, not what


class PullReply(msgspec.Struct, array_like=True, frozen=True):
    error: str | None = None  # why the pull was refused (the request's fault); None: the blocks follow
    num_blocks: int = 0
    failure: str | None = None  # why moving the blocks failed (the prefill side's): computed instead
    nixl_agent: bytes | None = None  # with NIXL: the prefill agent's metadata
    nixl_descs: bytes | None = None  # and the regions of the blocks wanted, in the pull's order


encode = msgspec.msgpack.Encoder().encode
decode_request = msgspec.msgpack.Decoder(PullRequest).decode
decode_reply = msgspec.msgpack.Decoder(PullReply).decode
