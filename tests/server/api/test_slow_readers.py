"""Clients that stop reading their streams. Generation does not wait for the client, so what
the server holds for one is bounded by --max-unread-tokens: past it the request is aborted and
its KV blocks freed, and the server's memory stays flat, whatever the request asked for."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.checkpoints import build_checkpoint
from tests.polling import wait_until
from tests.processes import MODEL, serve_process
from tests.server.api.servers import metric, send_without_reading

# One choice per request of the issue that found this: 8 choices, 20 logprobs, 2000 tokens.
HOSTILE = {
    "model": MODEL,
    "prompt": "tell me everything",
    "n": 8,
    "logprobs": 20,
    "max_tokens": 2000,
    "stream": True,
    "ignore_eos": True,
}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def read_until(sock, end: bytes) -> bytes:
    sock.settimeout(30)
    received = bytearray()
    while end not in received[-len(end) - (1 << 16) :]:
        chunk = sock.recv(1 << 16)
        assert chunk, "the server closed before the end of the stream"
        received += chunk
    return bytes(received)


def never_read(url: str, body: dict, clients: int, ended_before: float) -> list:
    """`clients` requests whose clients never read (4 KB receive buffers), once all have ended."""
    sockets = [send_without_reading(url, "/v1/completions", body, receive_buffer=4096) for _ in range(clients)]
    ended = lambda: sum(metric(url, "argosy_request_success_total", finished_reason=r) for r in ("abort", "length"))  # noqa: E731
    wait_until(lambda: ended() == ended_before + clients, 120, "the requests to end")
    return sockets


def test_clients_that_never_read_are_aborted_and_memory_stays_bounded(tmp_path):
    checkpoint = build_checkpoint(tmp_path / "long", "llama", max_position_embeddings=2304)
    with serve_process(checkpoint, "--kv-cache-memory", str(48 << 20), "--max-num-seqs", "32") as server:
        # The same clients with short outputs first: whatever the server allocates once (for
        # three such requests at a time) is in the baseline.
        sockets = never_read(server.url, {**HOSTILE, "max_tokens": 200}, 3, 0)
        before = rss_bytes(server.popen.pid)
        aborted = metric(server.url, "argosy_request_success_total", finished_reason="abort")
        try:
            sockets += never_read(server.url, HOSTILE, 3, 3)
            assert metric(server.url, "argosy_request_success_total", finished_reason="abort") == aborted + 3
            wait_until(lambda: metric(server.url, "argosy_kv_cache_usage_ratio") == 0, 30, "their blocks to be freed")
            grown = rss_bytes(server.popen.pid) - before
            # Each held at most 16k unread tokens and alternatives (a few MB); snapshots of the
            # whole output queued every step grew the server by hundreds of MB a request.
            assert grown < 24 << 20, f"the server grew by {grown >> 20} MiB"
            assert httpx.get(f"{server.url}/health").status_code == 200
            # A client that reads again finds its stream ended with the reason.
            events = read_until(sockets[-1], b"data: [DONE]")
            assert b'"code": "stream_stalled"' in events, events[-500:]
        finally:
            for sock in sockets:
                sock.close()
