"""Whether a live object has drifted from the manifest we built. Only the fields we set
count: the API server adds defaults and status, which are not drift. Resource quantities
compare by value ("1" and 1, "1Gi" and "1024Mi")."""
from __future__ import annotations

from typing import Any

from kubernetes.utils import parse_quantity


def differences(desired: Any, live: Any, path: str = "") -> list[str]:
    """Paths where `live` does not hold what `desired` says."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return [path or "/"]
        return [d for key, value in desired.items() for d in differences(value, live.get(key), f"{path}/{key}")]
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return [path]
        return [d for i, (a, b) in enumerate(zip(desired, live)) for d in differences(a, b, f"{path}/{i}")]
    if desired == live or (_is_quantity_path(path) and _same_quantity(desired, live)):
        return []
    return [path]


def _is_quantity_path(path: str) -> bool:
    return "/resources/" in path or path.endswith("/sizeLimit")


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except (ValueError, TypeError):
        return False
