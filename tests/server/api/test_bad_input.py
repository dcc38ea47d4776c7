"""Bad requests get the right status and an OpenAI-style error body, never a 500, and
leave no sequence behind."""

from __future__ import annotations

import httpx
import pytest

from tests.polling import wait_until
from tests.processes import MODEL
from tests.server.api.servers import run_server

OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
OK_COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
LONG_PROMPT = list(range(3, 600))  # beyond max_model_len (512)

CASES = [
    # (path, body or raw bytes, status, error type, param)
    ("/v1/completions", b'{"model": "tiny", "prompt": ', 400, "invalid_request_error", None),
    ("/v1/completions", b"not json at all", 400, "invalid_request_error", None),
    ("/v1/completions", {**OK_COMPLETION, "model": "gpt-4"}, 404, "invalid_request_error", "model"),
    ("/v1/chat/completions", {**OK_CHAT, "model": "gpt-4"}, 404, "invalid_request_error", "model"),
    ("/v1/completions", {"prompt": "hi"}, 400, "invalid_request_error", "model"),
    ("/v1/completions", {"model": MODEL}, 400, "invalid_request_error", "prompt"),
    ("/v1/completions", {**OK_COMPLETION, "max_tokens": "many"}, 400, "invalid_request_error", "max_tokens"),
    ("/v1/completions", {**OK_COMPLETION, "temperature": "hot"}, 400, "invalid_request_error", "temperature"),
    ("/v1/completions", {**OK_COMPLETION, "prompt": LONG_PROMPT}, 400, "invalid_request_error", "prompt"),
    ("/v1/completions", {**OK_COMPLETION, "max_tokens": 100000}, 400, "invalid_request_error", "max_tokens"),
    ("/v1/completions", {**OK_COMPLETION, "max_tokens": -1}, 400, "invalid_request_error", "max_tokens"),
    ("/v1/completions", {**OK_COMPLETION, "n": 0}, 400, "invalid_request_error", "n"),
    ("/v1/completions", {**OK_COMPLETION, "n": 100000}, 400, "invalid_request_error", "n"),
    ("/v1/completions", {**OK_COMPLETION, "temperature": -1}, 400, "invalid_request_error", "temperature"),
    ("/v1/completions", {**OK_COMPLETION, "top_p": 0}, 400, "invalid_request_error", "top_p"),
    ("/v1/completions", {**OK_COMPLETION, "logprobs": 50}, 400, "invalid_request_error", "logprobs"),
    ("/v1/completions", {**OK_COMPLETION, "prompt": ""}, 400, "invalid_request_error", "prompt"),
    ("/v1/completions", {**OK_COMPLETION, "prompt": []}, 400, "invalid_request_error", "prompt"),
    ("/v1/completions", {**OK_COMPLETION, "prompt": [5, 10**7]}, 400, "invalid_request_error", "prompt"),
    (
        "/v1/completions",
        {**OK_COMPLETION, "stream_options": {"include_usage": True}},
        400,
        "invalid_request_error",
        "stream_options",
    ),
    ("/v1/chat/completions", {**OK_CHAT, "messages": []}, 400, "invalid_request_error", "messages"),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "messages": [{"role": "robot", "content": "x"}]},
        400,
        "invalid_request_error",
        "messages[0].role",
    ),
    ("/v1/chat/completions", {**OK_CHAT, "messages": [{"content": "x"}]}, 400, "invalid_request_error", "messages[0]"),
    ("/v1/chat/completions", {**OK_CHAT, "messages": "hello"}, 400, "invalid_request_error", "messages"),
    ("/v1/chat/completions", {**OK_CHAT, "top_logprobs": 3}, 400, "invalid_request_error", "top_logprobs"),
    ("/v1/chat/completions", {**OK_CHAT, "tools": [{"type": "function"}]}, 400, "invalid_request_error", "tools[0]"),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "max_completion_tokens": -5},
        400,
        "invalid_request_error",
        "max_completion_tokens",
    ),
    ("/v1/chat/completions", {**OK_CHAT, "max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
    # Strict types: no number is a boolean, no boolean a number, no string either.
    ("/v1/completions", {**OK_COMPLETION, "prompt": [[False]]}, 400, "invalid_request_error", "prompt"),
    ("/v1/completions", {**OK_COMPLETION, "prompt": [1.5]}, 400, "invalid_request_error", "prompt"),
    ("/v1/completions", {**OK_COMPLETION, "logprobs": True}, 400, "invalid_request_error", "logprobs"),
    ("/v1/completions", {**OK_COMPLETION, "max_tokens": "8"}, 400, "invalid_request_error", "max_tokens"),
    ("/v1/completions", {**OK_COMPLETION, "ignore_eos": 1}, 400, "invalid_request_error", "ignore_eos"),
    (
        "/v1/completions",
        {**OK_COMPLETION, "stream": True, "stream_options": {"include_usage": "yes"}},
        400,
        "invalid_request_error",
        "stream_options.include_usage",
    ),
    ("/v1/completions", {**OK_COMPLETION, "seed": 2**64}, 400, "invalid_request_error", "seed"),
    ("/v1/completions", {**OK_COMPLETION, "top_k": 2**63}, 400, "invalid_request_error", "top_k"),
    # Lone surrogates, as JSON escapes can carry them; the 404 echoes the model name back.
    ("/v1/completions", b'{"model": "\\ud800", "prompt": "x"}', 404, "invalid_request_error", "model"),
    ("/v1/chat/completions", b'{"model": "a\\udfffb", "messages": []}', 404, "invalid_request_error", "model"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "bad \\ud800 text"}', 400, "invalid_request_error", "prompt"),
    (
        "/v1/chat/completions",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udfff"}]}',
        400,
        "invalid_request_error",
        "messages",
    ),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        400,
        "invalid_request_error",
        "messages[0].content",
    ),
    ("/v1/embeddings", {"model": MODEL, "input": "x"}, 404, "not_found_error", None),
]


@pytest.mark.parametrize(
    "path, body, status, kind, param", CASES, ids=[f"{i}-{c[0].rsplit('/', 1)[-1]}-{c[2]}" for i, c in enumerate(CASES)]
)
def test_bad_request(server, path, body, status, kind, param):
    if isinstance(body, bytes):
        response = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    else:
        response = httpx.post(server.url + path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == kind and error["param"] == param
    stats = server.engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_blocks_used) == (0, 0, 0)


@pytest.mark.parametrize(
    "headers", [{}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}]
)
def test_a_body_that_is_not_declared_json_gets_415(server, headers):
    body = b'{"model": "tiny", "prompt": "hi"}'
    response = httpx.post(f"{server.url}/v1/completions", content=body, headers=headers)
    assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"
    declared = {"content-type": "application/json; charset=utf-8"}
    assert httpx.post(f"{server.url}/v1/completions", content=body, headers=declared).status_code == 200


def test_oversize_body_gets_413(llama_checkpoint):
    with run_server(llama_checkpoint, max_request_body_bytes=1000) as srv:
        big = {**OK_COMPLETION, "prompt": "x" * 5000}
        response = httpx.post(f"{srv.url}/v1/completions", json=big)
        assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"

        def chunks():  # no Content-Length: the limit applies while the body streams in
            yield b'{"model": "tiny", "prompt": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}'

        response = httpx.post(
            f"{srv.url}/v1/completions", content=chunks(), headers={"content-type": "application/json"}
        )
        assert response.status_code == 413 and response.json()["error"]["type"] == "invalid_request_error"
        assert httpx.post(f"{srv.url}/v1/completions", json=OK_COMPLETION).status_code == 200


def test_api_key_guards_v1_but_not_health_live_or_metrics(llama_checkpoint):
    with run_server(llama_checkpoint, api_key="s3cret") as srv:
        denied = httpx.post(f"{srv.url}/v1/completions", json=OK_COMPLETION)
        assert denied.status_code == 401 and denied.json()["error"]["type"] == "authentication_error"
        for wrong in ("Bearer wrong", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret", "Bearer", ""):
            assert httpx.get(f"{srv.url}/v1/models", headers={"Authorization": wrong}).status_code == 401, wrong
        for scheme in ("bearer", "BEARER", "Bearer"):  # case-insensitive, as RFC 9110 has it
            headers = {"Authorization": f"{scheme}  s3cret"}
            assert httpx.get(f"{srv.url}/v1/models", headers=headers).status_code == 200, scheme
        assert httpx.get(f"{srv.url}/health").status_code == 200
        assert httpx.get(f"{srv.url}/live").status_code == 200
        assert httpx.get(f"{srv.url}/metrics").status_code == 200
        out = srv.client(api_key="s3cret").completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert out.usage.completion_tokens == 2


def test_one_access_log_line_per_request(server, caplog):
    with caplog.at_level("INFO", logger="argosy.access"):
        httpx.post(f"{server.url}/v1/completions", json={**OK_COMPLETION, "max_tokens": 3, "ignore_eos": True})
    (record,) = [r for r in caplog.records if r.name == "argosy.access"]
    fields = record.fields
    assert fields["request_id"].startswith("cmpl-") and fields["generated_tokens"] == 3
    assert fields["prompt_tokens"] > 0 and fields["finish_reason"] == "length"
    assert 0 < fields["ttft_s"] <= fields["total_s"]


def test_a_stream_dropped_by_its_client_leaves_one_access_log_line(server, caplog):
    body = {**OK_COMPLETION, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with caplog.at_level("INFO", logger="argosy.access"):
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as response:
            next(line for line in response.iter_lines() if line.startswith("data: "))
        # The connection is closed here, mid-stream.
        wait_until(lambda: [r for r in caplog.records if r.name == "argosy.access"], what="the dropped stream's line")
        httpx.post(f"{server.url}/v1/completions", json={**OK_COMPLETION, "max_tokens": 1})
        later = wait_until(
            lambda: [r for r in caplog.records if r.name == "argosy.access" and r.fields["finish_reason"] == "length"],
            what="the later request's line",
        )
    lines = [r for r in caplog.records if r.name == "argosy.access"]
    assert len(later) == 1 and len(lines) == 2
    (dropped,) = [r for r in lines if r is not later[0]]
    assert dropped.fields["finish_reason"] == "abort" and dropped.fields["generated_tokens"] < 400


def test_null_optional_fields_mean_their_defaults(server):
    nulls = {
        "n": None,
        "presence_penalty": None,
        "frequency_penalty": None,
        "stream": None,
        "temperature": None,
        "top_p": None,
        "seed": None,
        "stop": None,
        "stream_options": None,
    }
    completion = httpx.post(f"{server.url}/v1/completions", json={**OK_COMPLETION, **nulls, "echo": None})
    assert completion.status_code == 200 and len(completion.json()["choices"]) == 1
    chat = httpx.post(f"{server.url}/v1/chat/completions", json={**OK_CHAT, **nulls, "logprobs": None})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["role"] == "assistant"


def test_a_repeated_x_request_id_never_collides(server):
    import threading

    results = []

    def post(max_tokens: int) -> None:
        results.append(
            httpx.post(
                f"{server.url}/v1/chat/completions",
                headers={"X-Request-Id": "same"},
                json={**OK_CHAT, "max_tokens": max_tokens, "ignore_eos": True},
                timeout=60,
            )
        )

    threads = [threading.Thread(target=post, args=(n,)) for n in (40, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.json()["usage"]["completion_tokens"] for r in results) == [5, 40]
    assert all(r.json()["id"] == "same" for r in results)
    stats = server.engine.stats()
    assert (stats.num_running, stats.kv_blocks_used) == (0, 0)


def test_best_of_equal_to_the_default_n_is_accepted(server):
    response = httpx.post(f"{server.url}/v1/completions", json={**OK_COMPLETION, "best_of": 1})
    assert response.status_code == 200
