"""KVEventsConfig: `--kv-events-config` (JSON with vLLM's keys), checked field by field; a bad value
is refused naming it. Events are published only with `enable_kv_cache_events` true and a `zmq`
publisher (the default once enabled); `null` records nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from argosy.server.exceptions import InvalidRequestError
from argosy.server.json_setting import json_object

FIELD = "kv_events_config"
FIELDS = (
    "enable_kv_cache_events",
    "publisher",
    "endpoint",
    "replay_endpoint",
    "buffer_steps",
    "hwm",
    "max_queue_size",
    "topic",
)
PUBLISHERS = ("zmq", "null")


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"  # where the PUB socket binds
    replay_endpoint: str | None = None  # a ROUTER socket that replays buffered batches, when set
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's send high-water mark (messages a slow subscriber may lag)
    max_queue_size: int = 100_000  # batches waiting for the publisher thread before new ones are dropped
    topic: str = ""

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def parse(cls, value: str | dict | KVEventsConfig | None) -> KVEventsConfig | None:
        if value is None or isinstance(value, KVEventsConfig):
            return value
        value = json_object(value, FIELD, FIELDS)
        enabled = _typed(value, "enable_kv_cache_events", bool, False)
        publisher = _typed(value, "publisher", str, "zmq" if enabled else "null")
        if publisher not in PUBLISHERS:
            _refuse("publisher", f"must be one of {', '.join(PUBLISHERS)}, got {publisher!r}")
        endpoint = _endpoint(value, "endpoint", cls.endpoint)
        replay = _endpoint(value, "replay_endpoint", None)
        if replay is not None and replay == endpoint and not endpoint.endswith((":*", ":0")):
            _refuse("replay_endpoint", f"must differ from endpoint ({endpoint})")
        names = ("buffer_steps", "hwm", "max_queue_size")
        sizes = {name: _typed(value, name, int, getattr(cls, name)) for name in names}
        for name, size in sizes.items():
            if size < (0 if name == "hwm" else 1):
                _refuse(name, f"must be {'0' if name == 'hwm' else '1'} or more, got {size}")
        topic = _typed(value, "topic", str, "")
        return cls(enabled, publisher, endpoint, replay, topic=topic, **sizes)


def advertised(configured: str, bound: str | None) -> str:
    """The endpoint to tell subscribers: as configured (a wildcard host stays, for them to read as
    this host), with the port it was bound to where the configuration let the system choose one."""
    host, _, port = configured.rpartition(":")
    if bound is None or port not in ("*", "0"):
        return configured
    return f"{host}:{bound.rpartition(':')[2]}"


def _typed(value: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    got = value.get(name, default)
    # bool is an int to Python, never to a user: {"hwm": true} is refused.
    if got is not default and (not isinstance(got, kind) or (kind is int and isinstance(got, bool))):
        _refuse(name, f"must be {'a' if kind is not int else 'an'} {kind.__name__}, got {got!r}")
    return got


def _endpoint(value: dict[str, Any], name: str, default: str | None) -> str | None:
    got = _typed(value, name, str, default)
    if got is not None and (not got.startswith(("tcp://", "ipc://", "inproc://")) or got[-3:] == "://"):
        _refuse(name, f"must be a ZMQ endpoint such as tcp://*:5557, got {got!r}")
    return got


def _refuse(name: str, why: str) -> None:
    raise InvalidRequestError(f"{FIELD}.{name} {why}", param=f"{FIELD}.{name}")
