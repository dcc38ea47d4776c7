"""Whether a live object has drifted from the manifest we built, and the merge patch that
puts it back. Only the fields we set count: the API server adds defaults and status, other
controllers add labels and annotations, none of which is drift. Maps that decide what an
object selects (selectors, nodeSelector) are ours entirely: an extra key there is drift too.
Resource quantities compare by value ("1" and 1, "1Gi" and "1024Mi")."""
from __future__ import annotations

from typing import Any

from kubernetes.utils import parse_quantity

EXACT_MAPS = frozenset({"selector", "matchLabels", "nodeSelector"})


def differences(desired: Any, live: Any, path: str = "") -> list[str]:
    """Paths where `live` does not hold what `desired` says."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return [path or "/"]
        found = [d for key, value in desired.items() for d in differences(value, live.get(key), f"{path}/{key}")]
        if _exact(path):
            found += [f"{path}/{key}" for key in live if key not in desired]
        return found
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return [path]
        return [d for i, (a, b) in enumerate(zip(desired, live)) for d in differences(a, b, f"{path}/{i}")]
    if desired == live or (_is_quantity_path(path) and _same_quantity(desired, live)):
        return []
    return [path]


def merge_patch(desired: Any, live: Any, path: str = "") -> Any:
    """The JSON merge patch that makes `live` hold `desired`: desired itself, plus nulls that
    remove the extra keys of exact maps (a merge patch would otherwise keep them)."""
    if not isinstance(desired, dict):
        return desired
    live = live if isinstance(live, dict) else {}
    patch = {key: merge_patch(value, live.get(key), f"{path}/{key}") for key, value in desired.items()}
    if _exact(path):
        patch.update({key: None for key in live if key not in desired})
    return patch


def _exact(path: str) -> bool:
    return path.rsplit("/", 1)[-1] in EXACT_MAPS


def _is_quantity_path(path: str) -> bool:
    return "/resources/" in path or path.endswith("/sizeLimit")


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except (ValueError, TypeError):
        return False
