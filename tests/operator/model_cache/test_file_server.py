"""The agent's file server against hostile and careless clients, over real sockets: it serves only
regular files under its root that do not lead into its own folders, answers every malformed
request with a 4xx, and neither slow nor half-sent requests nor a flood of connections can hold
its threads; a fuzzing harness (methods, paths, ranges) finds no 5xx and no hold."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from argosy.operator.model_cache.agent.file_server import FileServer

TIMEOUT = 1.0  # the server's, for a request to arrive


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    (root / "ns" / "model").mkdir(parents=True)
    (root / "ns" / "model" / "config.json").write_bytes(b"0123456789")
    (root / ".staging" / "ns" / "next").mkdir(parents=True)
    (root / ".staging" / "ns" / "next" / "secret.bin").write_bytes(b"half-copied")
    return root


@pytest.fixture
def server(root: Path):
    served = FileServer(root, host="127.0.0.1", max_connections=4, timeout=TIMEOUT).start()
    yield served
    served.close()


def url(server: FileServer, path: str) -> str:
    return f"http://127.0.0.1:{server.port}/{path}"


def raw(server: FileServer, request: bytes, wait: float = 5.0) -> bytes:
    """What the server answers to `request`, sent as it is, read until it closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_a_file_whole_and_from_an_offset(server):
    assert httpx.get(url(server, "ns/model/config.json")).content == b"0123456789"
    part = httpx.get(url(server, "ns/model/config.json"), headers={"Range": "bytes=4-"})
    assert part.status_code == 206 and part.content == b"456789"
    assert part.headers["content-range"] == "bytes 4-9/10"
    head = httpx.head(url(server, "ns/model/config.json"))
    assert head.status_code == 200 and head.headers["content-length"] == "10" and head.content == b""


def test_a_range_at_or_past_the_end_is_416_with_the_size(server):
    for start in (10, 11, 10**18):
        answer = httpx.get(url(server, "ns/model/config.json"), headers={"Range": f"bytes={start}-"})
        assert answer.status_code == 416 and answer.headers["content-range"] == "bytes */10"
    for bad in ("bytes=-5", "bytes=1-2", "lines=1-", "bytes=99999999999999999999999-"):
        assert httpx.get(url(server, "ns/model/config.json"), headers={"Range": bad}).status_code == 400


def test_nothing_that_leads_into_staging_hidden_files_or_outside_the_root(server, root: Path, tmp_path: Path):
    (root / "ns" / "model" / "link").symlink_to(root / ".staging" / "ns" / "next" / "secret.bin")
    (root / "ns" / "dirlink").symlink_to(root / ".staging")
    (tmp_path / "outside.txt").write_text("outside")
    (root / "ns" / "out").symlink_to(tmp_path / "outside.txt")
    for path in (
        "ns/model/link",
        "ns/dirlink/ns/next/secret.bin",
        ".staging/ns/next/secret.bin",
        "ns/out",
        "ns/../../outside.txt",
        "%2e%2e/outside.txt",
        "ns/model",
        "",
    ):
        answer = httpx.get(url(server, path))
        assert answer.status_code == 404, path
        assert b"half-copied" not in answer.content and b"outside" not in answer.content


def test_a_fifo_is_refused_at_once(server, root: Path):
    os.mkfifo(root / "ns" / "model" / "model.safetensors")
    started = time.monotonic()
    assert httpx.get(url(server, "ns/model/model.safetensors"), timeout=5).status_code == 404
    assert time.monotonic() - started < 2


def test_malformed_requests_get_a_4xx(server):
    assert raw(server, b"GET /ns/%00secret HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 400")
    assert raw(server, b"GET /" + b"a" * 5000 + b" HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 414")
    assert raw(server, b"GET /" + b"a/" * 300 + b"x HTTP/1.0\r\n\r\n").split(b" ")[1][:1] == b"4"
    assert raw(server, b"POST /ns/model/config.json HTTP/1.0\r\nContent-Length: 0\r\n\r\n").startswith(b"HTTP/1.0 405")
    assert raw(server, b"BREW /ns/model/config.json HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 405")
    assert raw(server, b"garbage\r\n\r\n").split(b" ")[1][:1] == b"4"


def test_half_sent_requests_are_cut_off_and_hold_no_thread(server):
    socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]  # the server's cap
    for sock in socks:
        sock.sendall(b"GET /ns/model/config.json HTTP/1.0\r\n")  # headers never end
    # A fifth connection is turned away at once while they hold the slots...
    assert raw(server, b"GET /ns/model/config.json HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 503")
    # ...and each half-sent request is answered 408 and closed once its time is up.
    for sock in socks:
        sock.settimeout(5)
        answer = b""
        while chunk := sock.recv(1024):
            answer += chunk
        assert answer.startswith(b"HTTP/1.0 408")
        sock.close()
    assert httpx.get(url(server, "ns/model/config.json")).content == b"0123456789"


def test_a_request_trickled_a_byte_at_a_time_is_cut_off_all_the_same(server):
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.settimeout(5)
    request, answer, started = b"GET /ns/model/config.json HTTP/1.0\r\nX-Slow: " + b"a" * 100, b"", time.monotonic()

    def trickle() -> None:
        for byte in request:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return
            time.sleep(TIMEOUT / 10)

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    while chunk := sock.recv(1024):
        answer += chunk
    assert answer.startswith(b"HTTP/1.0 408") and time.monotonic() - started < TIMEOUT + 2
    sock.close()


path_pieces = st.sampled_from(
    ["ns", "model", "config.json", "..", ".", "", ".staging", "%00", "%2e%2e", "%2f", "a" * 300, "\u00e9", "%ff", "~"]
) | st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_characters="\r\n"), max_size=12)
methods = st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "CONNECT", "BREW"]) | st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12
)
ranges = (
    st.none()
    | st.builds("bytes={}-".format, st.integers(min_value=-5, max_value=2**70))
    | st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
)


@seed(20261204)
@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(method=methods, pieces=st.lists(path_pieces, max_size=6), range_=ranges)
def test_no_request_gets_a_5xx_or_holds_a_thread(server, method, pieces, range_):
    path = "/".join(quote(piece, safe="%/~.") for piece in pieces)
    head = f"{method} /{path} HTTP/1.0\r\n" + (f"Range: {range_}\r\n" if range_ is not None else "") + "\r\n"
    answer = raw(server, head.encode())
    assert answer.startswith(b"HTTP/1.0 ") and answer[9:10] in (b"2", b"4"), (head, answer[:80])
    assert httpx.get(url(server, "ns/model/config.json")).content == b"0123456789"  # and it serves on
