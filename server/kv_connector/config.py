"""KVTransferConfig: `--kv-transfer-config` (JSON in vLLM's shape: the connector's name, its role,
its extra config, and the module that defines it when it is not built in; a role alone picks the
P/D connector), checked field by field;
a bad value is refused naming it. `--swap-space N` is the built-in host tier's shorthand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from argosy.server.exceptions import InvalidRequestError
from argosy.server.json_setting import json_object

ROLES = ("kv_both", "kv_producer", "kv_consumer")
FIELDS = ("kv_connector", "kv_role", "kv_connector_extra_config", "kv_connector_module_path")
FIELD = "kv_transfer_config"
DEFAULT_CONNECTOR = "ZmqConnector"  # prefill/decode disaggregation's, as vLLM users name only a role


@dataclass(frozen=True)
class KVTransferConfig:
    kv_connector: str
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    kv_connector_module_path: str | None = None  # where a connector that is not built in is defined

    @classmethod
    def parse(cls, value: str | dict | KVTransferConfig | None) -> KVTransferConfig | None:
        if value is None or isinstance(value, KVTransferConfig):
            return value
        value = json_object(value, FIELD, FIELDS)
        connector = value.get("kv_connector", DEFAULT_CONNECTOR)
        if not isinstance(connector, str) or not connector:
            raise InvalidRequestError(f"{FIELD}.kv_connector must name a connector", param=f"{FIELD}.kv_connector")
        role = value.get("kv_role", "kv_both")
        if role not in ROLES:
            raise InvalidRequestError(
                f"{FIELD}.kv_role must be one of {', '.join(ROLES)}, got {role!r}", param=f"{FIELD}.kv_role"
            )
        extra = value.get("kv_connector_extra_config", {})
        if not isinstance(extra, dict):
            name = f"{FIELD}.kv_connector_extra_config"
            raise InvalidRequestError(f"{name} must be a JSON object", param=name)
        module = value.get("kv_connector_module_path")
        if module is not None and not isinstance(module, str):
            name = f"{FIELD}.kv_connector_module_path"
            raise InvalidRequestError(f"{name} must be a module's dotted name", param=name)
        return cls(connector, role, extra, module)
