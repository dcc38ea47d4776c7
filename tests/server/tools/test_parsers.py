"""Each tool-call parser: the whole parse finds the calls written in its family's format, and for
any split of the output into streamed chunks, what the stream sends adds up to the whole parse,
as the official SDK accumulates it (content joined; per call index, one id and name, arguments
joined)."""

from __future__ import annotations

import itertools
import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from argosy.server.tools.parsers import HermesParser, JsonArrayParser, Llama3JsonParser, NamedParser, Parsed
from argosy.server.tools.tool_stream import ToolStream

names = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)
scalars = st.one_of(st.integers(-999, 999), st.booleans(), st.none(), st.text(max_size=8))
arguments = st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), scalars, max_size=3)
calls = st.lists(st.tuples(names, arguments), min_size=0, max_size=3)
prose = st.text(alphabet=st.characters(blacklist_characters="<{["), max_size=30)
spacing = st.sampled_from(["", " ", "\n", "  \n"])


def stream(parser, text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]], set[str]]:
    """The SDK's accumulation of a stream cut at `cuts`: content, calls (name, arguments), ids."""
    tool_stream, content, accumulated, ids = ToolStream(parser), "", {}, set()
    bounds = [0, *sorted(set(cuts)), len(text)]
    for i, (start, end) in enumerate(itertools.pairwise(bounds)):
        new_content, deltas, _ = tool_stream.feed(text[start:end], final=i == len(bounds) - 2)
        content += new_content
        for delta in deltas:
            call = accumulated.setdefault(delta["index"], {"name": "", "arguments": ""})
            if "id" in delta:
                assert delta["index"] == len(accumulated) - 1 and not call["name"], "a call's name came twice"
                ids.add(delta["id"])
                call["name"] = delta["function"]["name"]
            call["arguments"] += delta["function"]["arguments"]
    return content, [(c["name"], c["arguments"]) for c in accumulated.values()], ids


def whole(parsed: Parsed) -> tuple[str, list[tuple[str, str]]]:
    return parsed.content, [(c.name, c.arguments) for c in parsed.calls]


def check_streams_add_up(parser, text: str, cuts: list[int]) -> Parsed:
    parsed = parser.parse(text, True)
    content, streamed_calls, ids = stream(parser, text, cuts)
    assert (content, streamed_calls) == whole(parsed)
    assert len(ids) == len(parsed.calls)
    return parsed


def cut_points(text_strategy):
    return text_strategy.flatmap(lambda t: st.tuples(st.just(t), st.lists(st.integers(0, len(t)), max_size=12)))


def hermes_text(draw_calls, before, between, per_block):
    blocks = []
    for name, args in draw_calls:
        body = json.dumps({"name": name, "arguments": args})
        blocks.append(f"<tool_call>{'[' + body + ']' if per_block else body}</tool_call>")
    return before + between.join(blocks)


@settings(max_examples=150, deadline=None)
@given(calls, prose, spacing, st.booleans(), st.data())
def test_hermes_and_smollm2_blocks(written, before, between, as_list, data):
    text = hermes_text(written, before, between, as_list)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    parsed = check_streams_add_up(HermesParser(), text, cuts)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == written
    assert parsed.content == before.strip()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(names, arguments), min_size=2, max_size=3), st.data())
def test_a_smollm2_block_holding_several_calls(written, data):
    body = json.dumps([{"name": n, "arguments": a} for n, a in written])
    text = f"<tool_call>{body}</tool_call>"
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    parsed = check_streams_add_up(HermesParser(), text, cuts)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == written


@settings(max_examples=150, deadline=None)
@given(calls, st.booleans(), spacing, st.data())
def test_llama3_json_calls(written, tagged, separator_space, data):
    objects = [json.dumps({"name": n, "parameters": a}) for n, a in written]
    text = ("<|python_tag|>" if tagged else "") + (";" + separator_space).join(objects)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    parsed = check_streams_add_up(Llama3JsonParser(), text, cuts)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == written
    assert parsed.content == ("" if written else ("<|python_tag|>" if tagged else ""))


@settings(max_examples=100, deadline=None)
@given(cut_points(prose))
def test_llama3_json_prose_is_content(case):
    text, cuts = case
    parsed = check_streams_add_up(Llama3JsonParser(), text, cuts)
    assert parsed.calls == [] and parsed.content == text.strip()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(names, arguments), min_size=1, max_size=3), spacing, st.data())
def test_the_required_list_and_a_named_function(written, space, data):
    text = json.dumps([{"name": n, "parameters": a} for n, a in written], indent=len(space) or None)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    parsed = check_streams_add_up(JsonArrayParser(), text, cuts)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == written
    args = json.dumps(written[0][1])
    parsed = check_streams_add_up(NamedParser("f"), args, cuts)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("f", args)]


@settings(max_examples=100, deadline=None)
@given(cut_points(st.text(alphabet='<tol_ca>/{}[]"name:, x', max_size=60)))
@example(("[}", []))  # once an endless loop: no item starts with "}" (nor ":")
@example(('[{"name": "a"}, x:', [4]))
def test_any_text_at_all_streams_to_its_whole_parse(case):
    """Malformed and truncated outputs too: what is sent never has to be taken back."""
    text, cuts = case
    for parser in (HermesParser(), Llama3JsonParser(), JsonArrayParser()):
        check_streams_add_up(parser, text, cuts)
