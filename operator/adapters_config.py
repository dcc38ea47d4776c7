"""InferenceService -> the ConfigMap listing its LoRA adapters, which the pods mount and their
servers watch (`--lora-config-file`). The Deployment names the ConfigMap, never its contents:
changing spec.adapters changes the file in the running pods (the kubelet refreshes the volume),
where the servers load, unload and reload adapters, and rolls nothing."""

from __future__ import annotations

import json
from typing import Any

from argosy.operator.kinds import CONFIG_MAP
from argosy.operator.labels import metadata
from argosy.operator.owner import Owner
from argosy.operator.spec import MODEL_MOUNT, InferenceServiceSpec

ADAPTERS_MOUNT = "/etc/argosy/adapters"
ADAPTERS_FILE = "adapters.json"


def lora_enabled(spec: InferenceServiceSpec) -> bool:
    return spec.lora is not None or bool(spec.adapters)


def adapters_file_path() -> str:
    return f"{ADAPTERS_MOUNT}/{ADAPTERS_FILE}"


def build_adapters_config_map(owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    listing = [{"name": a.name, "path": f"{MODEL_MOUNT}/{a.path}"} for a in spec.adapters]
    return {
        "apiVersion": CONFIG_MAP.api_version,
        "kind": CONFIG_MAP.kind,
        "metadata": metadata(owner),
        "data": {ADAPTERS_FILE: json.dumps({"adapters": listing}, indent=2) + "\n"},
    }
