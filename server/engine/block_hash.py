"""BlockHasher: the content hash of a full KV block, chained with its prefix's hash, so that equal
hashes mean equal token histories. Two algorithms, named as vLLM's --prefix-caching-hash-algo:

- `sha256` (the default): sha256 over the parent's 32-byte digest (a LoRA adapter's weights digest
  for a prompt's first block, nothing for the base model's) and the tokens as 8-byte little-endian
  signed integers.
- `sha256_cbor`: vLLM's, which llm-d's precise prefix-cache scorer computes from tokens itself:
  sha256 over the canonical CBOR array `[parent, [tokens...], extra_keys]`, the first block's parent
  being sha256 of the CBOR text of $PYTHONHASHSEED (32 random bytes when it is unset, as in vLLM:
  then no other process computes the same hashes). A LoRA block's extra keys are `[weights digest]`.

A block's external hash (KV events) is its digest's last 8 bytes, big-endian."""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Literal

HashAlgo = Literal["sha256", "sha256_cbor"]
SEED_ENV = "PYTHONHASHSEED"


def _head(major: int, value: int) -> bytes:
    if value < 24:
        return bytes([major << 5 | value])
    for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if value < 1 << (8 * size):
            return bytes([major << 5 | extra]) + value.to_bytes(size, "big")
    raise ValueError(f"{value} does not fit a CBOR head")


def cbor(value: object) -> bytes:
    """Canonical CBOR of what block hashes hold: None, integers, bytes, text and arrays (lists, tuples)."""
    if value is None:
        return b"\xf6"
    if isinstance(value, bool):
        return b"\xf5" if value else b"\xf4"
    if isinstance(value, int):
        return _head(0, value) if value >= 0 else _head(1, -1 - value)
    if isinstance(value, bytes):
        return _head(2, len(value)) + value
    if isinstance(value, str):
        data = value.encode()
        return _head(3, len(data)) + data
    if isinstance(value, list | tuple):
        return _head(4, len(value)) + b"".join(cbor(item) for item in value)
    raise TypeError(f"no CBOR encoding for {type(value).__name__}")


class BlockHasher:
    def __init__(self, algo: HashAlgo = "sha256", seed: str | None = None):
        self.algo = algo
        self.seed = seed  # the CBOR chain's seed; None: random
        self._first = b""
        if algo == "sha256_cbor":
            self._first = hashlib.sha256(cbor(seed)).digest() if seed is not None else os.urandom(32)

    @classmethod
    def from_env(cls, algo: HashAlgo) -> BlockHasher:
        return cls(algo, os.environ.get(SEED_ENV))

    def __call__(self, parent: bytes | None, token_ids: list[int], adapter: bytes | None = None) -> bytes:
        """The digest of a full block after `parent` (None: a prompt's first block), for the base
        model or the adapter whose weights digest is `adapter`."""
        if self.algo == "sha256":
            digest = hashlib.sha256(parent if parent is not None else adapter or b"")
            digest.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
            return digest.digest()
        extra = None if adapter is None else [adapter.hex()]
        return hashlib.sha256(cbor([parent if parent is not None else self._first, token_ids, extra])).digest()

    def describe(self) -> dict[str, str | None]:
        """How a consumer computes the same hashes from tokens (the log, /server_info, /v1/models)."""
        if self.algo == "sha256":
            return {
                "hash_function": "sha256",
                "hash_input": "the parent block's 32-byte digest (for a prompt's first block nothing, or a LoRA "
                "adapter's weights digest), then the block's token ids as 8-byte little-endian signed integers",
                "hash_seed": "",
                "external_hash": "the digest's last 8 bytes as an unsigned big-endian integer",
            }
        return {
            "hash_function": "sha256_cbor",
            "hash_input": "canonical CBOR of [parent digest, [token ids], extra keys]; a prompt's first block's "
            "parent is sha256(CBOR(PYTHONHASHSEED as text)); a LoRA block's extra keys are [weights digest as hex]",
            "hash_seed": self.seed,  # None: random in each process (PYTHONHASHSEED unset)
            "external_hash": "the digest's last 8 bytes as an unsigned big-endian integer",
        }
