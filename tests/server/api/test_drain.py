"""SIGTERM in a real `argosy serve` process: /health turns 503 and new requests are refused
at once, requests in flight finish (or, past --shutdown-timeout, end with an error event),
and the process exits 0."""
from __future__ import annotations

import json
import signal
import threading
import time

import httpx

from tests.processes import MODEL, serve_process


def stream_in_background(url: str, max_tokens: int, results: list, started: threading.Event) -> threading.Thread:
    def run() -> None:
        body = {"model": MODEL, "prompt": "once upon a time", "max_tokens": max_tokens, "stream": True,
                "ignore_eos": True}
        events = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()
        results.append(events)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def generated_text_tokens(events: list[str]) -> int:
    return sum(1 for e in events if e != "[DONE]" and "error" not in json.loads(e))


def test_sigterm_lets_requests_in_flight_finish_and_exits_zero(llama_checkpoint):
    with serve_process(llama_checkpoint, "--max-num-seqs", "4", "--shutdown-timeout", "60") as server:
        url = server.url
        results: list = []
        started = [threading.Event() for _ in range(3)]
        threads = [stream_in_background(url, 450, results, s) for s in started]
        for s in started:
            assert s.wait(30)
        server.popen.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert httpx.get(f"{url}/health").status_code == 503
        assert httpx.get(f"{url}/live").status_code == 200  # draining is not dead: no restart
        refused = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        for t in threads:
            t.join(60)
        assert server.popen.wait(60) == 0, server.output()
    assert len(results) == 3
    for events in results:
        assert events[-1] == "[DONE]"
        finals = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
        assert finals[-1] == "length" and not any("error" in e for e in events[:-1])


def test_requests_past_the_shutdown_timeout_end_with_an_error_event(llama_checkpoint):
    # Eight long streams on four sequence slots cannot all finish within 0.1 s.
    with serve_process(llama_checkpoint, "--max-num-seqs", "4", "--shutdown-timeout", "0.1",
                       "--max-model-len", "512") as server:
        results: list = []
        started = [threading.Event() for _ in range(8)]
        threads = [stream_in_background(server.url, 500, results, s) for s in started]
        assert started[0].wait(30)
        server.popen.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert server.popen.wait(60) == 0, server.output()
    cut = [events for events in results if events and "error" in json.loads(events[-2])]
    assert cut, "no stream was cut short"
    for events in cut:
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "shutting_down" and "shut down" in error["message"]
        assert generated_text_tokens(events) < 500
