"""Clients that open connections and send slowly, or not at all: each is dropped once its
headers (--header-timeout) or its body (--body-timeout) are late, however it trickles, and
connections beyond --max-connections are answered 503 and closed at once."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import httpx
import pytest

from tests.polling import wait_until
from tests.processes import MODEL, serve_process

PARTIAL_HEADERS = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setblocking(False)
    return sock


def answer(sock: socket.socket) -> bytes | None:
    """What the server sent and then closed with; None while the connection is still open."""
    received = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            return None
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    flags = ["--header-timeout", "2", "--body-timeout", "2", "--max-connections", "150"]
    with serve_process(llama_checkpoint, *flags) as proc:
        yield proc


def test_connections_that_send_their_headers_slowly_are_dropped(server):
    silent = [connect(server.url) for _ in range(50)]
    partial = [connect(server.url) for _ in range(50)]
    for sock in partial:
        sock.sendall(PARTIAL_HEADERS)
    trickling = connect(server.url)
    opened = time.monotonic()
    answers: dict[int, bytes] = {}

    def all_dropped() -> bool:
        if trickling.fileno() not in answers:  # a byte of headers each poll: no later deadline
            with contextlib.suppress(OSError):  # once dropped, sending fails
                trickling.send(b"X")
        for sock in [*silent, *partial, trickling]:
            if sock.fileno() not in answers and (got := answer(sock)) is not None:
                answers[sock.fileno()] = got
        return len(answers) == 101

    wait_until(all_dropped, 30, "the server to drop the slow connections")
    assert time.monotonic() - opened < 20
    assert all(a.startswith(b"HTTP/1.1 408") or a == b"" for a in answers.values())
    assert httpx.get(f"{server.url}/health").status_code == 200
    for sock in [*silent, *partial, trickling]:
        sock.close()


def test_a_body_shorter_than_its_content_length_gets_408(server):
    sock = connect(server.url)
    sock.sendall(PARTIAL_HEADERS + b"Content-Length: 1000\r\n\r\n" + b'{"model": "')
    got = wait_until(lambda: answer(sock), 30, "the server to answer the incomplete body")
    sock.close()
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), got
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_connections_past_the_limit_get_503_and_are_closed(server):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    held = [connect(server.url) for _ in range(150)]
    try:
        refused = httpx.post(f"{server.url}/v1/completions", json=body)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "too_many_connections"
    finally:
        for sock in held:
            sock.close()
    served = wait_until(
        lambda: (r := httpx.post(f"{server.url}/v1/completions", json=body)).status_code == 200 and r,
        10,
        "requests to be served again once they closed",
    )
    assert served.json()["choices"]
