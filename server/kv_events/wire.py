"""The events on the wire, in vLLM's encoding, so that routers written for vLLM read them unchanged:
each ZMQ message is `[topic, sequence number as 8 bytes big-endian, payload]`, the payload a
msgpack array `[ts, events, data_parallel_rank]` whose events are maps tagged by `type`, every
field present (null where it does not apply).

A block's hash on the wire is its external form, as vLLM's default: the engine's chained digest
(BlockHasher), cut to its last 8 bytes read as an unsigned big-endian integer."""

from __future__ import annotations

import msgspec

MEDIUM_DEVICE = "GPU"  # the device's prefix cache (vLLM names it so on every device)
MEDIUM_HOST = "CPU"  # the host KV tier
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)  # the replay socket's last sequence number


class KVCacheEvent(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def external_hash(digest: bytes) -> int:
    return int.from_bytes(digest[-8:], "big")


def sequence_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)
