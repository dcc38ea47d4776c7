"""Command-line flags from a configuration dataclass, so that each setting is written once.

A field declared with `setting(default, help)` becomes the flag `--field-name`: its type, its
default and its choices (a `Literal`) come from the field; booleans get `--x/--no-x`.
`config_from_args` builds the dataclass back from the parsed arguments."""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from typing import Any, Literal, TypeVar

Config = TypeVar("Config")
_HELP = "help"


def setting(
    default: Any, help: str, *, env: str | None = None, positional: bool = False, short: str | None = None
) -> Any:
    """A dataclass field that is also a command-line flag. `env` names a variable that
    overrides the default on the command line; `short` adds an alias such as "-n"."""
    metadata = {_HELP: help, "env": env, "positional": positional, "short": short}
    if default == []:  # a fresh list per instance
        return dataclasses.field(default_factory=list, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def settings_of(cls: type) -> list[dataclasses.Field]:
    """The fields of `cls` that are flags, in declaration order."""
    return [f for f in dataclasses.fields(cls) if _HELP in f.metadata]


def flag_name(field: dataclasses.Field) -> str:
    return "--" + field.name.replace("_", "-")


def default_of(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for field in settings_of(cls):
        meta = field.metadata
        kind, choices, is_list = _flag_type(hints[field.name])
        default = default_of(field)
        help_text = meta[_HELP]
        if meta["env"]:
            default = os.environ.get(meta["env"], default)
            help_text += f" (default: ${meta['env']})"
        if meta["positional"]:
            parser.add_argument(field.name, type=kind, help=help_text)
            continue
        names = [flag_name(field)] + ([meta["short"]] if meta["short"] else [])
        if default not in (None, []) and not meta["env"]:
            help_text += " (default: %(default)s)"
        if kind is bool:
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif is_list:
            # As vLLM: several values after one flag (--lora-modules a=x b=y), or the flag repeated.
            parser.add_argument(
                *names, action="extend", nargs="+", type=kind, default=default, help=help_text + " (repeatable)"
            )
        else:
            parser.add_argument(*names, type=kind, choices=choices, default=default, help=help_text)


def config_from_args(cls: type[Config], args: argparse.Namespace, **others: Any) -> Config:
    """`cls` from the parsed flags; `others` fills the fields that are not flags."""
    return cls(**{f.name: getattr(args, f.name) for f in settings_of(cls)}, **others)


def literal_choices(annotation: Any) -> tuple[Any, ...] | None:
    """The values a `Literal[...]` annotation (possibly `| None`) allows; None for other types."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)] if _is_union(annotation) else [annotation]
    if len(options) == 1 and typing.get_origin(options[0]) is Literal:
        return typing.get_args(options[0])
    return None


def _flag_type(annotation: Any) -> tuple[type, tuple[Any, ...] | None, bool]:
    """(argparse type, choices, repeatable) of a field's annotation."""
    choices = literal_choices(annotation)
    if choices is not None:
        return type(choices[0]), choices, False
    if _is_union(annotation):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is list:
        return typing.get_args(annotation)[0], None, True
    return annotation, None, False


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)
