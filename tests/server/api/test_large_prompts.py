"""Multi-megabyte prompts do not stop the server answering: a prompt certainly longer than the
context is refused from its length alone, and tokenizing or rendering one that might fit runs
off the event loop, while /health is timed throughout."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.checkpoints import build_checkpoint
from tests.processes import MODEL, serve_process
from tests.server.api.servers import timed_while

WORDS = "the quick brown fox jumps over a lazy dog "


def text_of(chars: int) -> str:
    return (WORDS * (chars // len(WORDS) + 1))[:chars]


def post_while_timing_health(url: str, path: str, body: dict) -> tuple[httpx.Response, list[float]]:
    """The response to `body`, and how long each /health call took while it was on its way."""
    result: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: result.append(httpx.post(f"{url}{path}", json=body, timeout=120)))
    latencies = timed_while(thread, lambda: httpx.get(f"{url}/health", timeout=30))
    return result[0], latencies


@pytest.fixture(scope="module")
def long_context(tmp_path_factory):
    """A checkpoint whose context takes a prompt of megabytes, so that nothing is certain from
    its length (one layer, one small KV head: a context of 1M tokens in 64 MiB of cache)."""
    folder = tmp_path_factory.mktemp("long") / "llama"
    shape = {"num_hidden_layers": 1, "num_key_value_heads": 1, "head_dim": 8}
    return build_checkpoint(folder, "llama", max_position_embeddings=1 << 20, **shape)


def test_an_8_mib_prompt_is_refused_from_its_length_and_health_answers_meanwhile(llama_checkpoint):
    with serve_process(llama_checkpoint) as server:
        body = {"model": MODEL, "prompt": text_of((8 << 20) - 1024), "max_tokens": 4}
        response, latencies = post_while_timing_health(server.url, "/v1/completions", body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "prompt" and "at least" in error["message"], error
        assert max(latencies) < 0.5, f"/health took up to {max(latencies):.2f} s"


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_tokenizing_a_long_prompt_leaves_health_answering(long_context, endpoint):
    prompt = text_of(3 << 20)  # some 2M tokens, over the 1M context: known only once tokenized
    if endpoint == "chat":
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}
    else:
        path, body = "/v1/completions", {"prompt": prompt}
    with serve_process(long_context, "--kv-cache-memory", str(65 << 20)) as server:
        started = time.monotonic()
        response, latencies = post_while_timing_health(server.url, path, {"model": MODEL, "max_tokens": 4, **body})
        took = time.monotonic() - started
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == ("messages" if endpoint == "chat" else "prompt"), error
        assert "tokens; max_model_len is" in error["message"], error  # it was tokenized
        assert max(latencies) < 0.5, f"/health took up to {max(latencies):.2f} s of the call's {took:.1f} s"
