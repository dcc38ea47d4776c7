"""Where the API key comes from: the flag or ARGOSY_API_KEY, or a file (a mounted Secret, so
the key is not in `ps`); never both, and a bad file stops `argosy serve` before the model loads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from argosy.server.api.middleware import bearer_token
from argosy.server.api.server_config import ServerConfig, resolve_api_key
from argosy.server.exceptions import ArgosyError


def test_the_key_comes_from_the_flag_or_from_a_file(tmp_path):
    secret = tmp_path / "api-key"
    secret.write_text("s3cret\n")  # as a Secret's file usually ends
    assert resolve_api_key(ServerConfig(api_key="k")) == "k"
    assert resolve_api_key(ServerConfig(api_key_file=str(secret))) == "s3cret"
    assert resolve_api_key(ServerConfig()) is None


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"api_key": "k", "api_key_file": "f"}, "not both"),
        ({"api_key_file": "/nonexistent/key"}, "No such file"),
        ({"api_key_file": "EMPTY"}, "empty"),
    ],
)
def test_bad_key_settings_are_refused_with_the_reason(tmp_path, settings, message):
    if settings.get("api_key_file") == "EMPTY":
        (tmp_path / "empty").write_text(" \n")
        settings = {"api_key_file": str(tmp_path / "empty")}
    with pytest.raises(ArgosyError, match=message):
        resolve_api_key(ServerConfig(**settings))


def test_argosy_serve_exits_2_on_a_missing_key_file():
    done = subprocess.run(
        [sys.executable, "-P", "-m", "argosy.cli", "serve", "--api-key-file", "/nonexistent/key"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "--api-key-file /nonexistent/key" in done.stderr


@pytest.mark.parametrize(
    "header, token",
    [
        (b"Bearer abc", b"abc"),
        (b"bearer  abc ", b"abc"),
        (b"BEARER abc", b"abc"),
        (b"Basic abc", None),
        (b"Bearer", None),
        (None, None),
    ],
)
def test_bearer_tokens_are_read_whatever_the_scheme_case(header, token):
    assert bearer_token(header) == token
