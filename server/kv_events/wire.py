"""The events on the wire, in vLLM's encoding, so that routers written for vLLM read them unchanged:
each ZMQ message is `[topic, sequence number as 8 bytes big-endian, payload]`, the payload a
msgpack array `[ts, events, data_parallel_rank]` whose events are maps tagged by `type`, every
field present (null where it does not apply).

A block's hash on the wire is its external form, as vLLM's default: the engine's chained
sha256 digest (BLOCK_HASH), cut to its last 8 bytes read as an unsigned big-endian integer."""

from __future__ import annotations

import msgspec

MEDIUM_DEVICE = "GPU"  # the device's prefix cache (vLLM names it so on every device)
MEDIUM_HOST = "CPU"  # the host KV tier
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)  # the replay socket's last sequence number

# How the engine hashes a full block, for consumers that hash tokens themselves (`/v1/models`,
# `/get_server_info` and the start-up log name it).
BLOCK_HASH = {
    "hash_function": "sha256",
    "hash_input": "parent block's 32-byte digest (none for a prompt's first block), then the block's token ids "
    "as 8-byte little-endian signed integers",
    "hash_seed": "",  # the base model's chain starts from nothing; a LoRA adapter's from its weights' digest
    "external_hash": "the digest's last 8 bytes as an unsigned big-endian integer",
}


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
