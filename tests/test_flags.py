"""Flags come from configuration dataclasses: names, types, defaults, choices and help are
the fields', and the parsed flags build the dataclass back."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Literal

import pytest

from argosy.flags import add_flags, config_from_args, setting, settings_of
from argosy.operator.main import OperatorOptions
from argosy.server.api.server_config import ServerConfig
from argosy.server.engine_config import EngineConfig
from argosy.server.generate_command import GenerateOptions


@dataclass
class Example:
    name: str = setting("", "positional", positional=True)
    size: int = setting(16, "an int")
    ratio: float | None = setting(None, "an optional float")
    mode: Literal["a", "b"] = setting("a", "a choice")
    enabled: bool = setting(True, "a switch")
    tags: list[str] = setting([], "repeatable", short="-t")
    secret: str | None = setting(None, "from the environment", env="EXAMPLE_SECRET")
    derived: int = 0  # not a flag


def parse(cls, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser, cls)
    return parser.parse_args(list(argv))


def test_fields_become_typed_flags_and_build_the_dataclass_back(monkeypatch):
    monkeypatch.setenv("EXAMPLE_SECRET", "s3")
    args = parse(
        Example, "x", "--size", "32", "--ratio", "0.5", "--mode", "b", "--no-enabled", "-t", "p", "--tags", "q"
    )
    assert config_from_args(Example, args, derived=7) == Example("x", 32, 0.5, "b", False, ["p", "q"], "s3", 7)
    assert config_from_args(Example, parse(Example, "y")) == Example("y", secret="s3")


def test_choices_and_types_are_enforced(capsys):
    for argv in (["x", "--mode", "c"], ["x", "--size", "big"]):
        with pytest.raises(SystemExit):
            parse(Example, *argv)
    assert "invalid" in capsys.readouterr().err


def test_the_repeatable_default_is_not_shared():
    first = config_from_args(Example, parse(Example, "x", "-t", "p"))
    assert first.tags == ["p"] and Example().tags == []


@pytest.mark.parametrize("cls", [EngineConfig, ServerConfig, GenerateOptions, OperatorOptions])
def test_every_setting_is_a_flag_with_help_and_the_defaults_agree(cls, monkeypatch):
    monkeypatch.delenv("ARGOSY_API_KEY", raising=False)
    args = parse(cls, "prompt") if cls is GenerateOptions else parse(cls)
    others = {f.name: f.default_factory() for f in dataclasses.fields(cls) if f not in settings_of(cls)}
    assert all(f.metadata["help"] for f in settings_of(cls))
    built = config_from_args(cls, args, **others)
    assert built == (cls("prompt") if cls is GenerateOptions else cls())


def test_engine_flags_reach_the_engine_config():
    from argosy.server.api.serve_command import add_serve_args, server_config

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    config = server_config(
        parser.parse_args(["--block-size", "32", "--no-enable-prefix-caching", "--port", "9", "--dtype", "bfloat16"])
    )
    assert config.engine == EngineConfig(block_size=32, enable_prefix_caching=False, dtype="bfloat16")
    assert config.port == 9
