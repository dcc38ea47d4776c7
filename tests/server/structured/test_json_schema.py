"""Every JSON-schema keyword accepted is enforced: for each, an instance that keeps it compiles
through and one that breaks it cannot be generated. Every keyword that cannot be enforced is
refused, naming it and where it is."""

from __future__ import annotations

import json

import pytest
import torch
import xgrammar as xgr

from argosy.server.exceptions import InvalidRequestError
from argosy.server.structured.grammar_mask import GrammarMask, GrammarState, Vocabulary
from argosy.server.structured.grammar_store import GrammarStore
from argosy.server.structured.json_schema import ANNOTATIONS, ENFORCED, FORMATS, check_schema
from argosy.server.structured.params import StructuredOutputsParams
from argosy.server.text.tokenizer import Tokenizer

STR = {"type": "string"}
INT = {"type": "integer"}
# keyword -> (schema, an instance keeping it, an instance breaking it)
KEEPS_AND_BREAKS = {
    "type": ({"type": "integer"}, "3", '"3"'),
    "properties": ({"type": "object", "properties": {"a": INT}}, '{"a": 1}', '{"a": "x"}'),
    "required": ({"type": "object", "properties": {"a": INT}, "required": ["a"]}, '{"a": 1}', "{}"),
    "additionalProperties": (
        {"type": "object", "properties": {"a": INT}, "additionalProperties": False},
        '{"a": 1}',
        '{"b": 1}',
    ),
    "unevaluatedProperties": (
        {"type": "object", "properties": {"a": INT}, "unevaluatedProperties": INT},
        '{"b": 2}',
        '{"b": "x"}',
    ),
    "patternProperties": ({"type": "object", "patternProperties": {"^x": INT}}, '{"x": 1}', '{"x": "s"}'),
    "minProperties": ({"type": "object", "additionalProperties": INT, "minProperties": 1}, '{"a": 1}', "{}"),
    "maxProperties": (
        {"type": "object", "additionalProperties": INT, "maxProperties": 1},
        '{"a": 1}',
        '{"a": 1, "b": 2}',
    ),
    "items": ({"type": "array", "items": INT}, "[1, 2]", '[1, "x"]'),
    "prefixItems": ({"type": "array", "prefixItems": [STR], "items": False}, '["a"]', "[1]"),
    "minItems": ({"type": "array", "items": INT, "minItems": 2}, "[1, 2]", "[1]"),
    "maxItems": ({"type": "array", "items": INT, "maxItems": 1}, "[1]", "[1, 2]"),
    "enum": ({"enum": ["a", 1, None]}, "null", '"b"'),
    "const": ({"const": {"a": 1}}, '{"a":1}', '{"a":2}'),
    "anyOf": ({"anyOf": [INT, {"type": "boolean"}]}, "true", '"x"'),
    "oneOf": ({"oneOf": [INT, STR]}, '"x"', "true"),
    "allOf": ({"allOf": [{"type": "integer", "minimum": 5}]}, "6", "3"),
    "$ref": ({"$defs": {"n": INT}, "$ref": "#/$defs/n"}, "1", '"x"'),
    "$defs": ({"$defs": {"n": STR}, "type": "array", "items": {"$ref": "#/$defs/n"}}, '["a"]', "[1]"),
    "definitions": ({"definitions": {"n": STR}, "$ref": "#/definitions/n"}, '"a"', "1"),
    "pattern": ({"type": "string", "pattern": "^[a-z]{2}$"}, '"ab"', '"a1"'),
    "minLength": ({"type": "string", "minLength": 2}, '"ab"', '"a"'),
    "maxLength": ({"type": "string", "maxLength": 2}, '"ab"', '"abc"'),
    "minimum": ({"type": "integer", "minimum": 5}, "5", "4"),
    "maximum": ({"type": "number", "maximum": 5}, "4.5", "5.5"),
    "exclusiveMinimum": ({"type": "integer", "exclusiveMinimum": 5}, "6", "5"),
    "exclusiveMaximum": ({"type": "integer", "exclusiveMaximum": 5}, "4", "5"),
    "multipleOf": ({"type": "integer", "multipleOf": 5}, "15", "7"),
    "format": ({"type": "string", "format": "uuid"}, '"123e4567-e89b-12d3-a456-426614174000"', '"x"'),
}
FORMAT_EXAMPLES = {
    "date": ("2024-02-29", "2023-02-29"),
    "time": ("23:59:59+01:00", "24:00:00Z"),
    "date-time": ("2024-04-30T10:00:00Z", "2024-04-31T10:00:00Z"),
    "duration": ("P1Y2M", "P"),
    "email": ("a@b.co", "a..b@c.d"),
    "ipv6": ("::1", "1:2"),
    "uri": ("http://a/b", "a b"),
    "uri-reference": ("/a/b", "a b"),
    "uri-template": ("/a{b}", "/a{"),
    "json-pointer": ("/a/b", "a"),
    "relative-json-pointer": ("0/a", "/a"),
    "uuid": ("123e4567-e89b-12d3-a456-426614174000", "123e4567"),
}
REFUSED = [
    ({"type": "array", "uniqueItems": True}, "/uniqueItems"),
    ({"type": "array", "contains": INT}, "/contains"),
    ({"not": STR}, "/not"),
    ({"if": INT, "then": {"minimum": 1}}, "/if"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "/dependentRequired"),
    ({"type": "object", "propertyNames": {"pattern": "^x"}}, "/propertyNames"),
    ({"allOf": [INT, {"minimum": 5}]}, "/allOf"),
    ({"oneOf": [INT, {"type": "number"}]}, "/oneOf"),
    ({"$ref": "http://example.com/schema.json"}, "/$ref"),
    ({"type": "string", "format": "ipv4"}, "/format"),
    ({"type": "integer", "nullable": True}, "/nullable"),  # OpenAPI's; type: [..., "null"] says it
    ({"type": "string", "format": "date", "maxLength": 12}, "/maxLength"),
    ({"type": "string", "pattern": "^a+$", "minLength": 2}, "/minLength"),
    ({"type": "integer", "multipleOf": 2, "maximum": 10}, "/maximum"),
    ({"type": "number", "multipleOf": 0.5}, "/multipleOf"),
    ({"type": "string", "pattern": "^(?=a)a+$"}, "/pattern"),
    ({"type": "string", "pattern": "a$|^b"}, "/pattern"),
    ({"properties": {"deep": {"type": "array", "items": {"not": INT}}}}, "/properties/deep/items/not"),
]


@pytest.fixture(scope="module")
def compiler(llama_checkpoint) -> GrammarStore:
    """The device side's grammars: what the sampler masks with."""
    return GrammarStore(llama_checkpoint, 320, [2], max_whitespace=4)


def compiled(compiler: GrammarStore, **constraint) -> xgr.CompiledGrammar:
    return compiler[StructuredOutputsParams(**constraint)]


def generable(grammar: xgr.CompiledGrammar, text: str) -> bool:
    matcher = xgr.GrammarMatcher(grammar)
    return matcher.accept_string(text) and matcher.is_completed()


def test_the_table_covers_every_enforced_keyword_and_format():
    assert set(KEEPS_AND_BREAKS) == ENFORCED
    assert set(FORMAT_EXAMPLES) == FORMATS


@pytest.mark.parametrize("keyword", sorted(KEEPS_AND_BREAKS))
def test_an_enforced_keyword_lets_through_what_keeps_it_and_nothing_that_breaks_it(compiler, keyword):
    schema, keeps, breaks = KEEPS_AND_BREAKS[keyword]
    grammar = compiled(compiler, json=schema)
    assert generable(grammar, keeps) and not generable(grammar, breaks)


@pytest.mark.parametrize("name", sorted(FORMAT_EXAMPLES))
def test_an_enforced_format_is_exact(compiler, name):
    keeps, breaks = FORMAT_EXAMPLES[name]
    grammar = compiled(compiler, json={"type": "string", "format": name})
    assert generable(grammar, json.dumps(keeps)) and not generable(grammar, json.dumps(breaks))


@pytest.mark.parametrize(("schema", "where"), REFUSED, ids=[w for _, w in REFUSED])
def test_what_cannot_be_enforced_is_refused_by_name_and_place(schema, where):
    with pytest.raises(InvalidRequestError) as refused:
        check_schema(schema, "response_format.json_schema.schema")
    assert f"at {where}" in str(refused.value)
    assert refused.value.param == "response_format.json_schema.schema"


def test_annotations_and_extensions_constrain_nothing_and_pass():
    schema = {**{word: "note" for word in ANNOTATIONS if not word.startswith("$")}, "x-vendor": 1, "type": "string"}
    check_schema(schema, "p")


def test_a_tagged_union_is_a_oneof_that_passes():
    tagged = {
        "oneOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}],
        "$defs": {
            "cat": {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]},
            "dog": {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"]},
        },
    }
    check_schema(tagged, "p")


def test_grammar_states_mask_surrogates_and_raw_control_characters_in_json_strings(llama_checkpoint, compiler):
    tokenizer = Tokenizer(llama_checkpoint)
    vocab = Vocabulary(tokenizer.vocab_bytes, 320)
    token_of = {raw: i for i, raw in enumerate(tokenizer.vocab_bytes)}
    state = GrammarState.start(compiled(compiler, json={"type": "string"}), [2], vocab, json=True)
    mask = GrammarMask()

    def allowed() -> set[bytes]:
        logits = torch.zeros(1, 320)
        mask.apply(logits, [0], [type("Seq", (), {"grammar": state})()])
        return {tokenizer.vocab_bytes[i] for i in torch.nonzero(logits[0].isfinite()).flatten().tolist()}

    assert state.accept(token_of[b'"'])
    assert b"\n" not in allowed() and b"\x06" not in allowed() and b"a" in allowed()
    assert state.accept(token_of[b"\xed"])
    after_lead = allowed()
    assert b"\x9f" in after_lead and b"\xa0" not in after_lead and b"\xbf" not in after_lead
