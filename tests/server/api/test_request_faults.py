"""One bad request does not take down the others. A failure the engine can pin on one request
(here: its sampling raises, in a real `argosy serve` whose sampler is made to fail for it; or
tokenizing its prompt or detokenizing its output raises in the API process) ends that request
with a 500, logged under its id, while the requests beside it get exactly the tokens they get
alone, and the server goes on serving."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import httpx

from tests.polling import wait_until
from tests.processes import MODEL, children, serve_process
from tests.server.api.servers import metric, run_server, stream_in_background

POISONED_SAMPLING = Path(__file__).parent / "poisoned_sampling"  # its sitecustomize.py
SEEDED = {"model": MODEL, "prompt": "once upon a time", "max_tokens": 12, "temperature": 1.0, "seed": 7}
GREEDY = {"model": MODEL, "prompt": "the sea was", "max_tokens": 12, "temperature": 0.0}
POISONED = {**SEEDED, "prompt": "a poisoned request", "seed": 8}


def completion(url: str, body: dict, request_id: str | None = None) -> httpx.Response:
    headers = {"X-Request-Id": request_id} if request_id else {}
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)


def test_a_request_whose_sampling_fails_gets_a_500_and_the_batch_beside_it_its_own_tokens(llama_checkpoint):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(POISONED_SAMPLING), os.environ.get("PYTHONPATH")])),
    }
    with serve_process(llama_checkpoint, env=env) as server:
        [core] = children(server.popen.pid)
        alone = [completion(server.url, body).json()["choices"][0]["text"] for body in (SEEDED, GREEDY)]
        # Paused, the core takes all three at once when it resumes: one step, one sampling batch.
        answers: dict[str, httpx.Response] = {}
        calls = {"poisoned": (POISONED, "poison-1"), "seeded": (SEEDED, None), "greedy": (GREEDY, None)}
        os.kill(core, signal.SIGSTOP)
        try:
            threads = [
                threading.Thread(target=lambda n=name, b=body, r=rid: answers.update({n: completion(server.url, b, r)}))
                for name, (body, rid) in calls.items()
            ]
            for t in threads:
                t.start()
            wait_until(lambda: metric(server.url, "argosy_num_requests_waiting") == 3, what="the three to be queued")
        finally:
            os.kill(core, signal.SIGCONT)
        for t in threads:
            t.join(60)
        poisoned = answers["poisoned"]
        assert poisoned.status_code == 500, poisoned.text
        error = poisoned.json()["error"]
        assert error["type"] == "internal_error"
        assert error["message"] == "sampling failed: RuntimeError: injected fault: a poisoned request"
        assert [answers[n].status_code for n in ("seeded", "greedy")] == [200, 200]
        assert [answers[n].json()["choices"][0]["text"] for n in ("seeded", "greedy")] == alone
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert completion(server.url, GREEDY).json()["choices"][0]["text"] == alone[1]  # and it goes on
        assert metric(server.url, "argosy_kv_cache_usage_ratio") == 0
        log = server.output()
        assert "request poison-1-0-" in log and "failed: sampling failed: RuntimeError: injected fault" in log


def test_a_request_whose_detokenizing_fails_gets_a_500_and_the_core_drops_it(llama_checkpoint):
    with run_server(llama_checkpoint) as server:
        outputs = server.engine.outputs
        real_append = outputs._append

        def append(state, seq, out):
            if out.request_id.startswith("broken") and seq.num_tokens == 3:
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
            return real_append(state, seq, out)

        outputs._append = append
        streams: list[list[str]] = []
        started = threading.Event()
        other = stream_in_background(server.url, 200, streams, started)
        assert started.wait(30)
        broken = httpx.post(
            f"{server.url}/v1/completions",
            json={"model": MODEL, "prompt": "once upon a time", "max_tokens": 400, "ignore_eos": True},
            headers={"X-Request-Id": "broken-1"},
            timeout=60,
        )
        other.join(60)
        assert broken.status_code == 500
        assert broken.json()["error"]["message"].startswith("detokenizing its output failed: UnicodeDecodeError")
        [events] = streams
        assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        # The core ran it for 400 tokens, were it not told: its blocks are free, nothing runs.
        wait_until(lambda: server.engine.stats().kv_blocks_used == 0 and server.engine.num_running == 0)
        assert server.state.ready


def test_a_request_whose_prompt_cannot_be_tokenized_gets_a_500_logged_under_its_id(llama_checkpoint, caplog):
    with run_server(llama_checkpoint) as server:
        tokenizer = server.engine.inputs.tokenizer
        real_encode = tokenizer.encode

        def encode(text, *args, **kwargs):
            if "explode" in text:
                raise RuntimeError("injected fault in the tokenizer")
            return real_encode(text, *args, **kwargs)

        tokenizer.encode = encode
        broken = completion(server.url, {**GREEDY, "prompt": "explode, please"}, "broken-2")
        chat = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "explode"}], "max_tokens": 4},
            headers={"X-Request-Id": "broken-3"},
            timeout=60,
        )
        for answer in (broken, chat):
            assert answer.status_code == 500
            assert (
                answer.json()["error"]["message"]
                == "preparing the prompt failed: RuntimeError: injected fault in the tokenizer"
            )
        assert completion(server.url, GREEDY).status_code == 200 and server.state.ready
    logged = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "request broken-2 failed while preparing its prompt" in logged
    assert "request broken-3 failed while preparing its prompt" in logged
