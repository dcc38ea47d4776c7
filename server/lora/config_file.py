"""The adapters file (`--lora-config-file`): a JSON list of {"name", "path"} (or an object whose
"adapters" is that list, as the operator's ConfigMap holds it), which the server watches. Each
read is compared with what the file held before: an entry added is loaded, one removed is
unloaded, one whose path changed is reloaded in place, and one whose path is the same but whose
weights changed (a digest the server checks each read) is reloaded too. A bad entry is reported
alone and never stops the others; an unreadable file changes nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass

from argosy.server.lora.request import NAME


@dataclass(frozen=True)
class AdapterEntry:
    name: str
    path: str


@dataclass
class AdaptersFile:
    entries: list[AdapterEntry]
    errors: list[str]  # entries that could not be read, each naming itself


def parse_adapters(text: str) -> AdaptersFile:
    """The file's entries; raises ValueError when the file as a whole is not a list of adapters."""
    data = json.loads(text) if text.strip() else []
    if isinstance(data, dict):
        data = data.get("adapters", [])
    if not isinstance(data, list):
        raise ValueError('expected a JSON list of {"name", "path"}, or an object whose "adapters" is one')
    entries, errors, seen = [], [], set()
    for i, item in enumerate(data):
        name = item.get("name") if isinstance(item, dict) else None
        path = item.get("path") if isinstance(item, dict) else None
        if not isinstance(name, str) or not NAME.match(name):
            errors.append(f"entry {i}: name {name!r} is not a valid model name")
        elif not isinstance(path, str) or not path:
            errors.append(f"entry {i} ({name}): path must be a non-empty string, got {path!r}")
        elif name in seen:
            errors.append(f"entry {i} ({name}): the name is listed twice; the first entry is served")
        else:
            seen.add(name)
            entries.append(AdapterEntry(name, path))
    return AdaptersFile(entries, errors)
