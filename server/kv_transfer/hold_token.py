"""A hold's token: the prefill engine's HMAC over the request, the blocks it holds for it and the
moment the hold ends, under a secret its worker made at start and shared with it alone. The side
channel serves a pull whose token checks out at once, without waiting to be told of the hold by a
step; a pull cannot forge one, nor widen one to other blocks or a later moment."""

from __future__ import annotations

import hashlib
import hmac


def sign(secret: bytes, request_id: str, block_ids: list[int], deadline: float) -> str:
    message = f"{request_id}|{','.join(map(str, block_ids))}|{deadline!r}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def verify(secret: bytes, request_id: str, block_ids: list[int], deadline: float, token: str) -> bool:
    return hmac.compare_digest(sign(secret, request_id, block_ids, deadline), token)
