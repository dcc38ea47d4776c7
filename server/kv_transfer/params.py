"""KVTransferParams: a request's `kv_transfer_params`, in vLLM's shape, as the vLLM router's P/D
mode sends them. The prefill leg says `do_remote_decode`: it is prefilled and its blocks held. The
decode leg carries what the prefill answer said (`do_remote_prefill` and where the blocks are):
it pulls them. Fields this server does not use are ignored, as vLLM does; the ones it uses are
checked, and a bad one is refused naming it."""

from __future__ import annotations

from typing import Any

import msgspec

from argosy.server.exceptions import InvalidRequestError

FIELD = "kv_transfer_params"
MAX_PORT = 65535


class KVTransferParams(msgspec.Struct, array_like=True, frozen=True, omit_defaults=True):
    do_remote_decode: bool = False  # the prefill leg: hold the prompt's blocks for a decode replica
    do_remote_prefill: bool = False  # the decode leg: pull the prompt's blocks from where they are held
    remote_engine_id: str | None = None
    remote_host: str | None = None
    remote_port: int | None = None
    remote_block_ids: list[int] | None = None  # the prompt's full blocks on the prefill side, in order
    remote_request_id: str | None = None  # the prefill leg's request id there: what the blocks are held for
    tp_size: int = 1
    hold_deadline: float | None = None  # when the hold ends, on the prefill host's monotonic clock
    hold_token: str | None = None  # the prefill engine's signature of the hold (hold_token.py)

    @classmethod
    def parse(cls, value: Any) -> KVTransferParams | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise InvalidRequestError(f"{FIELD} must be a JSON object", param=FIELD)
        decode, prefill = (_flag(value, name) for name in ("do_remote_decode", "do_remote_prefill"))
        if decode and prefill:
            raise InvalidRequestError(
                f"{FIELD}: do_remote_decode and do_remote_prefill cannot both be true", param=FIELD
            )
        if not prefill:
            return cls(do_remote_decode=decode) if decode else None
        engine, host, request_id = (
            _text(value, name) for name in ("remote_engine_id", "remote_host", "remote_request_id")
        )
        port = value.get("remote_port")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= MAX_PORT:
            raise InvalidRequestError(
                f"{FIELD}.remote_port must be a port number, got {port!r}", param=f"{FIELD}.remote_port"
            )
        blocks = value.get("remote_block_ids")
        if not isinstance(blocks, list) or not all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks
        ):
            name = f"{FIELD}.remote_block_ids"
            raise InvalidRequestError(f"{name} must be a list of block numbers", param=name)
        tp_size = value.get("tp_size", 1)
        if tp_size != 1:
            name = f"{FIELD}.tp_size"
            raise InvalidRequestError(f"{name}: blocks are pulled from one rank only; got {tp_size!r}", param=name)
        deadline, token = value.get("hold_deadline"), _text(value, "hold_token")
        if isinstance(deadline, bool) or not isinstance(deadline, int | float):
            name = f"{FIELD}.hold_deadline"
            raise InvalidRequestError(f"{name} must be the hold's deadline, as the prefill answer gave it", param=name)
        return cls(False, True, engine, host, port, blocks, request_id, 1, float(deadline), token)

    def answer(self) -> dict[str, Any]:
        """The params as vLLM's responses carry them (every field present)."""
        return {name: getattr(self, name) for name in self.__struct_fields__}


def _flag(value: dict, name: str) -> bool:
    flag = value.get(name, False)
    if flag is None:
        return False
    if not isinstance(flag, bool):
        raise InvalidRequestError(f"{FIELD}.{name} must be true or false", param=f"{FIELD}.{name}")
    return flag


def _text(value: dict, name: str) -> str:
    text = value.get(name)
    if not isinstance(text, str) or not text:
        raise InvalidRequestError(f"{FIELD}.{name} must be a non-empty string", param=f"{FIELD}.{name}")
    return text
