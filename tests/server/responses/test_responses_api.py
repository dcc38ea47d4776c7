"""The Responses API over HTTP on the default model, through the official openai client: a plain
answer equal to the chat call's (its metadata echoed), streamed with the typed events the SDK's
stream helper checks, tools (a call, then its output continued by previous_response_id), a schema
(responses.parse and the stream helper's text_format), a conversation continued by id (its history
rendered as chat would, its prefix cached), the stored response read back and deleted, another
key's ids not found, and bad input refused."""

from __future__ import annotations

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.server.api.servers import run_server

MODEL = "default"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "name": "get_weather", "description": "A city's weather", "parameters": WEATHER}]
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def server():
    with run_server(None, served_model_name=MODEL, dtype="auto", max_model_len=1024, kv_cache_memory=64 << 20) as s:
        yield s


def greedy(**args) -> dict:
    return {"model": MODEL, "temperature": 0, "max_output_tokens": 48, **args}


def test_a_plain_answer_is_the_chat_calls_and_is_stored(server):
    client = server.client()
    response = client.responses.create(**greedy(input=QUESTION, instructions="Be brief.", metadata={"run": "a1"}))
    chat = client.chat.completions.create(
        model=MODEL,
        temperature=0,
        max_tokens=48,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}],
    )
    assert response.id.startswith("resp_") and response.status == "completed" and response.metadata == {"run": "a1"}
    assert response.output_text == chat.choices[0].message.content and "Paris" in response.output_text
    [item] = response.output
    assert item.type == "message" and item.status == "completed" and item.content[0].annotations == []
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert client.responses.retrieve(response.id).model_dump() == response.model_dump()


def test_streamed_events_add_up_to_the_whole_answer(server):
    client = server.client()
    whole = client.responses.create(**greedy(input=QUESTION))
    with client.responses.stream(**greedy(input=QUESTION)) as stream:
        events = list(stream)
        final = stream.get_final_response()  # the helper checks ids, indexes and every item's end
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text
    assert client.responses.retrieve(final.id).output_text == whole.output_text


def test_a_cut_answer_is_incomplete(server):
    response = server.client().responses.create(**greedy(input="Tell me a long story.", max_output_tokens=5))
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 5
    with server.client().responses.create(
        **greedy(input="Tell me a long story.", max_output_tokens=5, stream=True)
    ) as s:
        events = list(s)
    assert events[-1].type == "response.incomplete" and events[-1].response.output[0].status == "incomplete"


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_required_tool_call_and_its_output_continued_by_id(server, streamed):
    client = server.client()
    ask = greedy(
        input="What is the weather in Paris?",
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=150,
    )
    if streamed:
        with client.responses.stream(**ask) as stream:
            events = list(stream)
            first = stream.get_final_response()
        arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert arguments == first.output[-1].arguments
    else:
        first = client.responses.create(**ask)
    assert len(first.output) == 1
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(__import__("json").loads(call.arguments), WEATHER)
    assert client.responses.retrieve(first.id).output[-1].call_id == call.call_id
    then = client.responses.create(
        **greedy(
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 degrees and sunny"}],
            tools=TOOLS,
        )
    )
    assert then.status == "completed" and then.output_text and then.previous_response_id == first.id
    assert then.usage.input_tokens > first.usage.input_tokens


class Capital(BaseModel):
    country: str
    capital: str


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_schema_through_the_parse_helpers(server, streamed):
    ask = greedy(input=QUESTION, text_format=Capital, max_output_tokens=60)
    if streamed:
        with server.client().responses.stream(**ask) as stream:
            deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
            parsed = stream.get_final_response()
        assert deltas == parsed.output_text
    else:
        parsed = server.client().responses.parse(**ask)
    assert isinstance(parsed.output_parsed, Capital) and parsed.output_parsed.capital == "Paris"


def test_a_conversation_continued_by_id_is_rendered_as_chat_and_its_prefix_is_cached(server):
    client = server.client()
    first = client.responses.create(**greedy(input="My name is Ada. Say hello."))
    second = client.responses.create(**greedy(input="What is my name?", previous_response_id=first.id))
    messages = [
        {"role": "user", "content": "My name is Ada. Say hello."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    rendered = httpx.post(f"{server.url}/tokenize", json={"model": MODEL, "messages": messages}).json()
    assert second.usage.input_tokens == rendered["count"]
    assert second.usage.input_tokens_details.cached_tokens >= 16  # the first turn's blocks
    chat = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=48, messages=messages)
    assert second.output_text == chat.choices[0].message.content


def test_deleted_unknown_and_other_keys_ids_are_not_found(server):
    client, other = server.client(), server.client(api_key="another-key")
    response = client.responses.create(**greedy(input=QUESTION, max_output_tokens=4))
    for call in (lambda: other.responses.retrieve(response.id), lambda: other.responses.delete(response.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError) as foreign:
        other.responses.create(**greedy(input="hi", previous_response_id=response.id))
    assert foreign.value.code == "previous_response_not_found" and foreign.value.param == "previous_response_id"
    with pytest.raises(openai.BadRequestError):  # a stored response was not made in the background
        client.responses.cancel(response.id)
    client.responses.delete(response.id)
    for call in (
        lambda: client.responses.retrieve(response.id),
        lambda: client.responses.delete(response.id),
        lambda: client.responses.retrieve("resp_unknown"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()


def test_a_wrong_method_names_both_of_the_paths_methods(server):
    answer = httpx.put(f"{server.url}/v1/responses/resp_x")
    assert answer.status_code == 405 and answer.headers["allow"] == "DELETE, GET"


def test_store_false_keeps_nothing(server):
    client = server.client()
    response = client.responses.create(**greedy(input=QUESTION, max_output_tokens=4, store=False))
    assert response.model_extra["store"] is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"input": [{"role": ["user"], "content": "hi"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"text": {"format": "json"}}, "text.format"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"max_output_tokens": -1}, "max_output_tokens"),
        ({"temperature": "hot"}, "temperature"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    answer = httpx.post(f"{server.url}/v1/responses", json={"model": MODEL, "input": "hi", **body})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.json()
