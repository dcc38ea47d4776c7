"""The tool-call format is read from the chat template, so that auto needs no flag."""

from __future__ import annotations

import pytest

from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.default_model import resolve_model_path
from argosy.server.text.tokenizer import Tokenizer
from argosy.server.tools.family import family_of, shipped_template, tools_template

# The parts of their families' templates that tell them apart.
QWEN = "{%- if tools %}...<tools>{{ tool | tojson }}</tools>...<tool_call>\\n{{ tool_call | tojson }}</tool_call>"
LLAMA3 = "{%- if tools %}Environment: ipython\\n...<|python_tag|>{{ tool_call.arguments | tojson }}<|eom_id|>"


def test_families_from_their_templates():
    assert family_of(QWEN) == "hermes"
    assert family_of(LLAMA3) == "llama3_json"
    assert family_of("{{ messages }}") is None and family_of(None) is None


def test_the_default_model_is_smollm2_and_gets_the_shipped_tools_template():
    template = Tokenizer(resolve_model_path(None)).chat_template
    assert family_of(template) == "smollm2" and "tools" not in template
    assert tools_template(template, "smollm2") == shipped_template("smollm2")
    assert tools_template(QWEN, "hermes") == QWEN  # a template that reads tools is kept


def test_a_template_without_tools_of_an_unknown_family_is_refused():
    with pytest.raises(InvalidRequestError, match="--chat-template"):
        tools_template("{{ messages }}", None)
