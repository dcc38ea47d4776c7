"""Structured outputs over HTTP: the official client's parse() on the default model, constrained
streams, every way of asking for a constraint, and the bad-input table, streamed or not."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.processes import MODEL
from tests.server.api.servers import run_server
from tests.server.structured.schema_corpus import SLOW_SCHEMA

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Answer in JSON."}], "max_tokens": 200}
COMPLETION = {"model": MODEL, "prompt": "Answer in JSON:", "max_tokens": 200}
POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"enum": ["up", "down"]}},
    "required": ["x", "y"],
}


class City(BaseModel):
    name: str = Field(max_length=30)
    population: int = Field(ge=0, le=40_000_000)
    capital: bool


def test_the_official_client_parses_a_pydantic_model_on_the_default_model(default_server):
    client = default_server.client()
    completion = client.chat.completions.parse(
        model="default",
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        response_format=City,
        max_tokens=100,
        temperature=0,
    )
    choice = completion.choices[0]
    assert isinstance(choice.message.parsed, City) and choice.finish_reason == "stop"


@pytest.mark.parametrize(
    "ask",
    [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "point", "schema": POINT}}},
        {"structured_outputs": {"json": POINT}},
        {"guided_json": POINT},
        {"guided_json": json.dumps(POINT), "guided_decoding_backend": "xgrammar"},
    ],
    ids=["response_format", "structured_outputs", "guided_json", "guided_json_text"],
)
def test_each_way_of_asking_for_a_schema_is_enforced_streamed_or_not(server, ask):
    whole = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, **ask, "temperature": 1.0, "seed": 3})
    assert whole.status_code == 200, whole.text
    text = whole.json()["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(text), POINT)
    stream = server.client().chat.completions.create(
        model=MODEL, messages=CHAT["messages"], stream=True, temperature=1.0, seed=3, extra_body=ask
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text


def test_completions_take_constraints_too(server):
    for ask, check in [
        ({"structured_outputs": {"regex": "[a-c]{2}-[0-9]"}}, lambda t: len(t) == 4 and t[2] == "-"),
        ({"guided_choice": ["left", "right"]}, lambda t: t in ("left", "right")),
        ({"response_format": {"type": "json_object"}, "max_tokens": 400}, lambda t: isinstance(json.loads(t), dict)),
    ]:
        out = httpx.post(f"{server.url}/v1/completions", json={**COMPLETION, **ask, "seed": 1, "temperature": 1.0})
        assert out.status_code == 200, out.text
        choice = out.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and check(choice["text"]), choice


def test_constrained_requests_are_counted_by_kind_and_their_compiles_timed(server):
    before = server.metric("argosy_structured_requests_total", kind="regex")
    compiles = server.metric("argosy_grammar_compile_seconds_count")
    body = {**COMPLETION, "structured_outputs": {"regex": "z{1,3}[0-9]"}}
    assert httpx.post(f"{server.url}/v1/completions", json=body).status_code == 200
    assert server.metric("argosy_structured_requests_total", kind="regex") == before + 1
    assert server.metric("argosy_grammar_compile_seconds_count") == compiles + 1
    assert httpx.post(f"{server.url}/v1/completions", json=body).status_code == 200  # cached: no compile
    assert server.metric("argosy_grammar_compile_seconds_count") == compiles + 1


def schema_format(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


BAD = [
    # (extra fields, param)
    (schema_format({"type": "object", "properties": {"a": {"not": {}}}}), "response_format.json_schema.schema"),
    (schema_format({"type": "strange"}), "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": 'root ::= missing_rule "x"'}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"backend": "outlines", "regex": "a"}}, "structured_outputs.backend"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"guided_regex": "a", **schema_format({"type": "integer"})}, "guided_regex"),
    ({"guided_json": {"type": "integer"}, "guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
    ({"guided_regex": "a+", "guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ({"guided_regex": "a+", "min_tokens": 2}, "min_tokens"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("extra", "param"), BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)])
def test_a_bad_constraint_is_a_400_naming_its_field(server, extra, param, stream):
    response = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, **extra, "stream": stream})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    stats = server.engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_blocks_used) == (0, 0, 0)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_grammar_past_the_time_limit_is_a_400_and_others_are_served(llama_checkpoint, stream):
    with run_server(llama_checkpoint, structured_outputs_compile_timeout=0.2) as srv:
        slow = {**CHAT, **schema_format({**SLOW_SCHEMA, "title": f"stream={stream}"}), "stream": stream}
        response = httpx.post(f"{srv.url}/v1/chat/completions", json=slow, timeout=60)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert "time limit" in error["message"] and error["param"] == "response_format.json_schema.schema"
        ok = httpx.post(f"{srv.url}/v1/chat/completions", json={**CHAT, "max_tokens": 3})
        assert ok.status_code == 200
