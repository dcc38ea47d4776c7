"""Which tool-call format a checkpoint writes, read from its chat template, so that `auto`
tool choice works with no flag; and the chat template that shows it tools. A template that
mentions no tools (SmolLM2's) is replaced, for requests with tools, by the one shipped here for
its family."""

from __future__ import annotations

from functools import cache
from importlib import resources

from argosy.server.exceptions import InvalidRequestError
from argosy.server.tools.parsers import PARSERS

SMOLLM2_MARK = "named SmolLM"  # its template's default system prompt


@cache
def shipped_template(family: str) -> str:
    return resources.files("argosy.server.tools").joinpath(f"templates/{family}.jinja").read_text()


def family_of(template: str | None) -> str | None:
    """The tool-call parser a chat template implies (None: none is known)."""
    if not template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    if SMOLLM2_MARK in template:
        return "smollm2"
    return None


def tools_template(template: str | None, family: str | None) -> str:
    """The template to render a conversation with tools: the checkpoint's if it reads them,
    else the one shipped for its family."""
    if template and "tools" in template:
        return template
    if family is not None and resources.files("argosy.server.tools").joinpath(f"templates/{family}.jinja").is_file():
        return shipped_template(family)
    raise InvalidRequestError(
        "this model's chat template does not show it tools; start the server with a --chat-template that does",
        param="tools",
    )


def check_parser(name: str) -> str:
    if name not in PARSERS:
        raise InvalidRequestError(f"tool_call_parser must be one of {', '.join(PARSERS)}, got {name!r}")
    return name
