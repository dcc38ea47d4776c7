"""The connector a KVTransferConfig names: a built-in one, or a class of that name in the module
`kv_connector_module_path` names (vLLM's way of plugging one in). A connector class makes its two
halves, each where it lives (`worker`, then `scheduler`), and checks its own configuration."""

from __future__ import annotations

import importlib
from typing import Any

from argosy.server.exceptions import InvalidRequestError
from argosy.server.kv_connector.config import KVTransferConfig

BUILT_IN = {
    "HostTierConnector": "argosy.server.kv_tier.host_connector",
    "ZmqConnector": "argosy.server.kv_transfer.connector",
    "NixlConnector": "argosy.server.kv_transfer.connector",
}


def connector_class(config: KVTransferConfig) -> Any:
    """The class, its configuration checked; refused naming the field when there is none such."""
    module_name = config.kv_connector_module_path or BUILT_IN.get(config.kv_connector)
    if module_name is None:
        raise InvalidRequestError(
            f"kv_transfer_config.kv_connector {config.kv_connector!r} is not built in (built in: "
            f"{', '.join(BUILT_IN)}); name its module in kv_connector_module_path",
            param="kv_transfer_config.kv_connector",
        )
    try:
        cls = getattr(importlib.import_module(module_name), config.kv_connector)
    except (ImportError, AttributeError) as exc:
        raise InvalidRequestError(
            f"kv_transfer_config: no connector {config.kv_connector!r} in {module_name} ({exc})",
            param="kv_transfer_config.kv_connector",
        ) from None
    cls.check(config)
    return cls
