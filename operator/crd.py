"""The CRDs of Argosy's kinds, each generated from its description (a CustomResource: the
InferenceService's in resource.py) and the typed models it names.

`python -P -m argosy.operator.crd` writes crds/ and the chart's copy; `--check` only says whether
they are up to date (a test runs it). Pydantic models become a Kubernetes structural schema:
`X | None` is an optional X, `Literal` an enum, `int | str` int-or-string, `dict[str, X]` a
map, `dict[str, Any]` an object kept as it is; Field bounds, patterns, descriptions and
defaults carry over, and `json_schema_extra` adds what pydantic cannot say (CEL rules). An
object field gets the default {} when the object has defaults of its own, so that the API
server fills them in."""

from __future__ import annotations

import argparse
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from argosy.generated_files import sync_generated
from argosy.operator.custom_resource import CustomResource
from argosy.operator.model_cache.resource import MODEL_CACHE_RESOURCE
from argosy.operator.resource import INFERENCE_SERVICE_RESOURCE

ROOT = Path(__file__).resolve().parents[1]
RESOURCES = (INFERENCE_SERVICE_RESOURCE, MODEL_CACHE_RESOURCE)
_CONSTRAINTS = {
    annotated_types.Ge: ("minimum", "ge"),
    annotated_types.Le: ("maximum", "le"),
    annotated_types.MinLen: ("minLength", "min_length"),
    annotated_types.MaxLen: ("maxLength", "max_length"),
}
_EXCLUSIVE = {annotated_types.Gt: ("minimum", "gt"), annotated_types.Lt: ("maximum", "lt")}
_SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string"}


def targets(resource: CustomResource) -> list[Path]:
    """Where the resource's CRD is written: crds/, and the chart's copy."""
    return [
        ROOT / "crds" / f"{resource.crd_name}.yaml",
        ROOT / "charts" / "argosy" / "crds" / f"{resource.crd_name}.yaml",
    ]


def build_crd(resource: CustomResource) -> dict[str, Any]:
    schema = model_schema(resource.model)
    schema["properties"] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        **schema["properties"],
    }
    version = {
        "name": resource.kind.version,
        "served": True,
        "storage": True,
        "subresources": resource.subresources,
        "additionalPrinterColumns": list(resource.printer_columns),
        "schema": {"openAPIV3Schema": schema},
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": resource.crd_name,
            "labels": {"app.kubernetes.io/name": "argosy", "app.kubernetes.io/part-of": "argosy"},
        },
        "spec": {"group": resource.kind.group, "scope": "Namespaced", "names": resource.names, "versions": [version]},
    }


def render(resource: CustomResource) -> str:
    model = resource.model
    header = (
        f"# The {resource.kind.kind} CustomResourceDefinition. Generated from {model.__module__}.{model.__name__}\n"
        "# and the models it holds by `python -P -m argosy.operator.crd`: edit the models, not this file.\n"
    )
    return header + yaml.safe_dump(build_crd(resource), sort_keys=False, width=100, allow_unicode=True)


def model_schema(cls: type[BaseModel]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    if cls.__doc__ and "__doc__" in cls.__dict__:
        schema["description"] = " ".join(cls.__doc__.split())
    required = [name for name, field in cls.model_fields.items() if field.is_required()]
    if required:
        schema["required"] = required
    schema.update(cls.model_config.get("json_schema_extra") or {})
    schema["properties"] = {name: field_schema(field) for name, field in cls.model_fields.items()}
    return schema


def field_schema(field: FieldInfo) -> dict[str, Any]:
    schema = type_schema(field.annotation)
    if field.description:
        schema["description"] = field.description
    constraints = _constraints(field)
    if schema.get("type") == "array":  # a list's length bounds count its items
        constraints = {k.replace("Length", "Items"): v for k, v in constraints.items()}
    schema.update(constraints)
    default = _default(field)
    if default is not None:
        schema["default"] = default
    return _ordered(schema)


def type_schema(annotation: Any) -> dict[str, Any]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        schema = type_schema(args[0])
        for extra in args[1:]:
            if isinstance(extra, FieldInfo):
                schema.update(_constraints(extra))
                if extra.description:
                    schema["description"] = extra.description
        return schema
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if set(options) == {int, str}:
            return {"x-kubernetes-int-or-string": True}
        (only,) = options  # an optional value; the API server knows no other unions
        return type_schema(only)
    if origin is Literal:
        return {"type": _SCALARS[type(args[0])], "enum": list(args)}
    if origin is list:
        return {"type": "array", "items": type_schema(args[0])}
    if origin is dict:
        if args[1] is Any:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"type": "object", "additionalProperties": type_schema(args[1])}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_schema(annotation)
    return {"type": _SCALARS[annotation]}


def _constraints(field: FieldInfo) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in field.metadata:
        if type(item) in _CONSTRAINTS:
            keyword, attribute = _CONSTRAINTS[type(item)]
            found[keyword] = getattr(item, attribute)
        elif type(item) in _EXCLUSIVE:  # OpenAPI v3.0, as Kubernetes reads it: the bound and a flag
            keyword, attribute = _EXCLUSIVE[type(item)]
            found[keyword] = getattr(item, attribute)
            found["exclusive" + keyword.capitalize()] = True
        elif getattr(item, "pattern", None):
            found["pattern"] = item.pattern
    found.update(field.json_schema_extra or {})
    return found


def _default(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        made = field.default_factory()
        has_defaults = isinstance(made, BaseModel) and any(
            not f.is_required() and _default(f) is not None for f in type(made).model_fields.values()
        )
        return {} if has_defaults else None
    return None if field.default is PydanticUndefined else field.default


_ORDER = (
    "type",
    "x-kubernetes-int-or-string",
    "description",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "maxItems",
    "pattern",
    "format",
    "default",
)


def _ordered(schema: dict[str, Any]) -> dict[str, Any]:
    """Keywords in reading order: what it is, what it means, what it allows, then its parts."""
    first = {k: schema[k] for k in _ORDER if k in schema}
    return {**first, **{k: v for k, v in schema.items() if k not in first}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -P -m argosy.operator.crd", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a written CRD differs from the models")
    args = parser.parse_args(argv)
    texts = {path: render(resource) for resource in RESOURCES for path in targets(resource)}
    return sync_generated(texts, ROOT, "python -P -m argosy.operator.crd", args.check)


if __name__ == "__main__":
    sys.exit(main())
