"""Offline stand-in for the API server's admission of InferenceServices: the CRD's
structural schema (with defaults, as the server applies them) checked with jsonschema, and
its CEL rules (x-kubernetes-validations) evaluated with cel-python."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]


def load_crd(name: str = "inferenceservices.argosy.dev") -> dict[str, Any]:
    return yaml.safe_load((ROOT / "crds" / f"{name}.yaml").read_text())


def openapi_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def to_jsonschema(schema: dict[str, Any], root: bool = True) -> dict[str, Any]:
    """Kubernetes' OpenAPI dialect as JSON Schema. Unknown fields are errors (kubectl's
    default field validation) instead of being pruned. At the root, apiVersion,
    kind and metadata are always allowed."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes") and k not in ("default",)}
    if schema.get("x-kubernetes-int-or-string"):
        # Value keywords apply to the values of their type: patterns to strings, bounds to ints.
        out.pop("type", None)
        strings = {k: out.pop(k) for k in ("pattern", "minLength", "maxLength") if k in out}
        ints = {k: out.pop(k) for k in ("minimum", "maximum") if k in out}
        out["anyOf"] = [{"type": "integer", **ints}, {"type": "string", **strings}]
    for bound in ("Minimum", "Maximum"):  # OpenAPI 3.0's boolean flags are JSON Schema's exclusive bounds
        if out.pop(f"exclusive{bound}", False) is True:
            out[f"exclusive{bound}"] = out.pop(bound.lower())
    if "properties" in schema:
        out["properties"] = {k: to_jsonschema(v, root=False) for k, v in schema["properties"].items()}
        if root:
            out["properties"] = {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                **out["properties"],
            }
        if not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in schema:
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = to_jsonschema(schema["additionalProperties"], root=False)
    if "items" in schema:
        out["items"] = to_jsonschema(schema["items"], root=False)
    return out


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Structural defaulting, as the API server does it before validation."""
    if not isinstance(obj, dict) or "properties" not in schema:
        return obj
    result = dict(obj)
    for key, sub in schema["properties"].items():
        if key not in result and "default" in sub:
            result[key] = copy.deepcopy(sub["default"])
        if key in result:
            result[key] = apply_defaults(sub, result[key])
    return result


def cel_failures(schema: dict[str, Any], obj: Any, path: str = "") -> list[str]:
    failures = []
    for rule in schema.get("x-kubernetes-validations", []):
        env = celpy.Environment()
        program = env.program(env.compile(rule["rule"]))
        if not bool(program.evaluate({"self": celpy.json_to_cel(obj)})):
            failures.append(f"{path or '<root>'}: {rule.get('message', rule['rule'])}")
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj:
                failures += cel_failures(sub, obj[key], f"{path}.{key}" if path else key)
    if isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            failures += cel_failures(schema["items"], item, f"{path}[{i}]")
    return failures


def admit(obj: dict[str, Any], schema: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """(the object as stored, the reasons it would be rejected) by the API server serving
    `schema` (default: the InferenceService CRD's): the schema with its defaults, then the CEL rules."""
    schema = schema or openapi_schema(load_crd())
    defaulted = apply_defaults(schema, obj)
    validator = jsonschema.Draft7Validator(to_jsonschema(schema))
    errors = [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(defaulted)]
    if not errors:
        errors = cel_failures(schema, defaulted)
    return defaulted, errors


# The add-ons' own CRDs, kept beside the repository as reference data: KEDA v2.20, the
# Inference Extension's InferencePool, the Gateway API's HTTPRoute (standard channel) and
# LeaderWorkerSet.
ADD_ON_CRDS = {
    "ScaledObject": ROOT.parent / "shared" / "keda" / "keda.sh_scaledobjects.yaml",
    "InferencePool": ROOT.parent / "shared" / "gateway-api" / "inference.networking.k8s.io_inferencepools.yaml",
    "HTTPRoute": ROOT.parent / "shared" / "gateway-api" / "gateway.networking.k8s.io_httproutes.yaml",
    "LeaderWorkerSet": ROOT.parent / "shared" / "lws" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
}


def add_on_rejections(obj: dict[str, Any]) -> list[str]:
    """Why the add-on's API server would reject `obj`, by its CRD's version the object names."""
    crd = yaml.safe_load(ADD_ON_CRDS[obj["kind"]].read_text())
    version = obj["apiVersion"].rsplit("/", 1)[-1]
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
    return admit(obj, schema)[1]
