"""Whether a live object has drifted from the manifest we built, and the merge patch that
puts it back.

Only the fields we set count: the API server adds defaults and status, other controllers add
labels and annotations, none of which is drift; and it drops empty values, so an empty map,
list or string we set equals an absent one. Maps that decide what an object selects
(selectors, nodeSelector) are ours entirely: an extra key there is drift. Resource quantities
compare by value ("1" and 1, "1Gi" and "1024Mi").

A field we set once and no longer set must go: the last manifest we applied is kept on the
object (kubectl does the same) and the patch sets such fields to null. The replica count is
the exception: when autoscaling takes it over, it stays as it is."""

from __future__ import annotations

import json
from typing import Any

from kubernetes.utils import parse_quantity

from argosy.operator.kinds import GROUP

LAST_APPLIED = f"{GROUP}/last-applied"
EXACT_MAPS = frozenset({"selector", "matchLabels", "nodeSelector"})
KEPT_WHEN_DROPPED = frozenset({"/spec/replicas"})


def with_last_applied(desired: dict[str, Any]) -> dict[str, Any]:
    """The manifest carrying a copy of itself as an annotation."""
    meta = desired["metadata"]
    annotations = {
        **meta.get("annotations", {}),
        LAST_APPLIED: json.dumps(desired, sort_keys=True, separators=(",", ":")),
    }
    return {**desired, "metadata": {**meta, "annotations": annotations}}


def last_applied(live: dict[str, Any]) -> dict[str, Any]:
    raw = ((live.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}


def differences(desired: Any, live: Any, path: str = "") -> list[str]:
    """Paths where `live` does not hold what `desired` says."""
    if _empty(desired) and _empty(live):
        return []
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


def merge_patch(desired: Any, live: Any, previous: Any = None, path: str = "") -> Any:
    """The JSON merge patch that makes `live` hold `desired`: desired itself, plus nulls for
    what we applied before and dropped since, and for extra keys of exact maps."""
    if not isinstance(desired, dict):
        return desired
    live = live if isinstance(live, dict) else {}
    previous = previous if isinstance(previous, dict) else {}
    patch = {
        key: merge_patch(value, live.get(key), previous.get(key), f"{path}/{key}") for key, value in desired.items()
    }
    dropped = [key for key in previous if key not in desired and f"{path}/{key}" not in KEPT_WHEN_DROPPED]
    extra = [key for key in live if key not in desired] if _exact(path) else []
    patch.update(dict.fromkeys([*dropped, *extra]))
    return patch


def _empty(value: Any) -> bool:
    """None, "", [], or a map holding only such values: what the API server leaves out."""
    if isinstance(value, dict):
        return all(_empty(v) for v in value.values())
    return value is None or value == [] or value == ""


def _exact(path: str) -> bool:
    return path.rsplit("/", 1)[-1] in EXACT_MAPS


def _is_quantity_path(path: str) -> bool:
    return "/resources/" in path or path.endswith("/sizeLimit")


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except (ValueError, TypeError):
        return False
