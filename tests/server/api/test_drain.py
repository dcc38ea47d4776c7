"""How `argosy serve` stops. SIGTERM: /health turns 503 and new requests are refused at once,
requests in flight finish (or, past --shutdown-timeout, end with an error event), and the
process exits 0. A checkpoint that is not there: it exits with the code the operator reads.

The drain's decisions are tested on a server whose engine core process is paused, so that
requests are certainly still in flight when the drain starts; a real process shows the exit."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import httpx

from argosy.server.exceptions import CheckpointNotFoundError
from tests.polling import wait_until
from tests.processes import MODEL, free_port, serve_command, serve_process
from tests.server.api.servers import metric, paused_core, run_server, send_without_reading, stream_in_background


def generated_text_tokens(events: list[str]) -> int:
    return sum(1 for e in events if e != "[DONE]" and "error" not in json.loads(e))


def streams_in_flight(srv, count: int, results: list) -> list[threading.Thread]:
    """`count` streams, each with its first tokens received."""
    started = [threading.Event() for _ in range(count)]
    threads = [stream_in_background(srv.url, 450, results, s) for s in started]
    for s in started:
        assert s.wait(30)
    return threads


def test_a_drain_refuses_new_requests_and_lets_requests_in_flight_finish(llama_checkpoint):
    results: list = []
    with run_server(llama_checkpoint, max_num_seqs=4, shutdown_timeout=60) as srv:
        threads = streams_in_flight(srv, 3, results)
        with paused_core(srv):
            srv.sigterm()
            wait_until(lambda: httpx.get(f"{srv.url}/health").status_code == 503, what="/health to turn 503")
            assert httpx.get(f"{srv.url}/live").status_code == 200  # draining is not dead: no restart
            refused = httpx.post(f"{srv.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
            assert all(t.is_alive() for t in threads) and srv.thread.is_alive()
        for t in threads:
            t.join(60)
        srv.thread.join(60)
        assert not srv.thread.is_alive()  # the server stopped by itself once they finished
    assert len(results) == 3
    for events in results:
        assert events[-1] == "[DONE]" and generated_text_tokens(events) == 450
        finals = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
        assert finals[-1] == "length" and not any("error" in e for e in events[:-1])


def test_requests_past_the_shutdown_timeout_end_with_an_error_event(llama_checkpoint):
    results: list = []
    with run_server(llama_checkpoint, max_num_seqs=4, shutdown_timeout=0.1) as srv:
        threads = streams_in_flight(srv, 2, results)
        with paused_core(srv):
            srv.sigterm()  # the paused streams cannot finish within the timeout
            for t in threads:
                t.join(60)
        srv.thread.join(60)
        assert not srv.thread.is_alive()
    assert len(results) == 2
    for events in results:
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "shutting_down" and "shut down" in error["message"]
        assert generated_text_tokens(events) < 450


def test_sigterm_lets_requests_in_flight_finish_and_exits_zero(llama_checkpoint):
    with serve_process(llama_checkpoint, "--max-num-seqs", "4", "--shutdown-timeout", "60") as server:
        results: list = []
        started = [threading.Event() for _ in range(3)]
        threads = [stream_in_background(server.url, 450, results, s) for s in started]
        for s in started:
            assert s.wait(30)
        server.popen.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert server.popen.wait(60) == 0, server.output()
    assert len(results) == 3
    for events in results:
        assert events[-1] == "[DONE]"
        finals = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
        assert finals[-1] == "length" and not any("error" in e for e in events[:-1])


def test_a_missing_checkpoint_exits_with_the_code_the_operator_reads(tmp_path):
    # What a pod whose node lacks the checkpoint does: exit at once, with EX_NOINPUT.
    command = serve_command(tmp_path / "absent", free_port())
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == CheckpointNotFoundError.exit_code
    assert f"{tmp_path / 'absent' / 'config.json'}: file not found" in result.stderr


def read_slowly(sock, bytes_per_second: float) -> bytes:
    """Everything until the server closes, at about `bytes_per_second`."""
    received = bytearray()
    while chunk := sock.recv(1 << 16):
        received += chunk
        time.sleep(len(chunk) / bytes_per_second)  # the slow reader the test is about: no wait for a condition
    return bytes(received)


def test_the_drain_waits_for_a_slow_reader_to_receive_its_response(llama_checkpoint):
    # Some 9 MB of events, which the client reads at 1 MB/s from the moment of SIGTERM: the
    # engine is done with them long before the socket is; uvicorn's graceful timeout (5 s) cut it.
    body = {"model": MODEL, "prompt": "a", "n": 32, "logprobs": 20, "max_tokens": 400, "stream": True}
    flags = ["--shutdown-timeout", "60", "--max-unread-tokens", str(1 << 22), "--kv-cache-memory", str(32 << 20)]
    with serve_process(llama_checkpoint, *flags) as server:
        sock = send_without_reading(server.url, "/v1/completions", {**body, "ignore_eos": True}, receive_buffer=4096)
        wait_until(lambda: metric(server.url, "argosy_request_success_total", finished_reason="length") == 1, 60)
        server.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: "draining" in server.output(), 10, "the drain to start")
        with sock:
            received = read_slowly(sock, 1e6)
        assert server.popen.wait(60) == 0, server.output()[-3000:]
        printed = server.output()
    assert received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), received[-200:]
    assert len(received) > 8 << 20 and b'"error"' not in received  # far more than the sockets buffer
    assert "Cancel" not in printed and "ERROR" not in printed  # uvicorn cut no response
