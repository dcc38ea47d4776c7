"""Tool calls through the official openai client against the default model on loopback: required,
a named function and auto, streamed and not (the SDK's accumulation of a stream equals the whole
answer), a two-turn exchange with a tool result, and the bad-input table."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from argosy.server.tools.request import read_tools
from tests.processes import MODEL

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 20}}, "required": ["tz"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "A city's weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time in a time zone", "parameters": TIME},
    },
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# What SmolLM2's family writes for a call; a constraint makes the model write it, so that auto's
# parsing is exercised on the default model whatever the model would have chosen.
AUTO_CALL = '<tool_call>[{"name": "get_time", "arguments": {"tz": "UTC"}}]</tool_call>'


def accumulate(stream) -> tuple[str | None, list[tuple[str, str]], str | None]:
    """What the SDK's chunks add up to: content, calls (name, arguments) and the finish reason."""
    content, calls, finish = None, {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if choice.delta.content:
            content = (content or "") + choice.delta.content
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
            assert delta.id is None or delta.id == call["id"]
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [(c["name"], c["arguments"]) for c in calls.values()], finish


def whole_and_streamed(server, **args):
    client = server.client()
    whole = client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, temperature=0, **args)
    streamed = accumulate(
        client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, temperature=0, stream=True, **args)
    )
    choice = whole.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    assert all(c.id.startswith("call_") and c.type == "function" for c in choice.message.tool_calls or [])
    assert streamed == (choice.message.content, calls, choice.finish_reason)
    return choice, calls


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_are_valid_calls_of_the_tools(default_server, parallel):
    choice, calls = whole_and_streamed(
        default_server, tool_choice="required", parallel_tool_calls=parallel, max_tokens=150
    )
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert calls and (parallel or len(calls) == 1)
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_a_named_function_is_called_with_valid_arguments(default_server):
    named = {"type": "function", "function": {"name": "get_time"}}
    choice, calls = whole_and_streamed(default_server, tool_choice=named, max_tokens=100)
    assert choice.finish_reason == "stop" and [name for name, _ in calls] == ["get_time"]
    jsonschema.validate(json.loads(calls[0][1]), TIME)


def test_auto_reads_the_calls_the_model_writes_in_its_format(default_server):
    forced = {"structured_outputs": {"choice": [AUTO_CALL]}}
    choice, calls = whole_and_streamed(default_server, tool_choice="auto", max_tokens=60, extra_body=forced)
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert calls == [("get_time", '{"tz": "UTC"}')]


def test_auto_without_a_call_is_plain_content(default_server):
    choice, calls = whole_and_streamed(default_server, tool_choice="auto", max_tokens=12)
    assert calls == [] and choice.message.content and choice.finish_reason == "length"


def test_a_two_turn_exchange_with_a_tool_result(default_server):
    client = default_server.client()
    first = client.chat.completions.create(
        model="default", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=100
    )
    call = first.choices[0].message.tool_calls[0]
    turns = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    second = client.chat.completions.create(
        model="default", messages=turns, tools=TOOLS, tool_choice="none", max_tokens=30, temperature=0
    )
    assert second.choices[0].message.content and second.choices[0].message.tool_calls is None
    tokenizer, chat = default_server.engine.tokenizer, default_server.state.chat_format
    prompt = chat.prompt(tokenizer, turns, True, read_tools(TOOLS, "none", None))
    assert '"temperature": 21' in prompt and f'"name": "{call.function.name}"' in prompt


OK_CHAT = {"model": MODEL, "messages": ASK, "max_tokens": 2}
TOOL = TOOLS[0]
BAD = [
    ({"tools": []}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [TOOL, TOOL]}, "tools"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}]},
        "tools[0].function.parameters",
    ),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    (
        {"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}},
        "tool_choice",
    ),
    (
        {"messages": [*ASK, {"role": "tool", "content": "21 degrees"}]},
        "messages[1].tool_call_id",
    ),
    (
        {"messages": [*ASK, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}]},
        "messages[1].tool_calls[0].function.arguments",
    ),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("extra", "param"), BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)])
def test_bad_tool_input_is_a_400_naming_its_field(server, extra, param, stream):
    response = httpx.post(f"{server.url}/v1/chat/completions", json={**OK_CHAT, **extra, "stream": stream})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def test_auto_on_a_model_whose_format_is_unknown_says_so(server):
    """The tiny test checkpoint's template names no tool format: auto is refused, required is served."""
    body = {**OK_CHAT, "tools": [TOOL]}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "tool_choice"
