"""A model across nodes, as separate hosts would start it: the leader (`argosy serve --nnodes 2
--node-rank 0`) and a headless node (`--node-rank 1 --headless`), each its own process started
only with the leader's address and its node's index; their pipeline stages meet over gloo on
loopback. Served completions give the one-process server's greedy tokens, and a rank of the
headless node killed ends the leader with that rank named, within seconds."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.checkpoints import build_checkpoint
from tests.polling import wait_until
from tests.processes import MODEL, alive, children, free_port, serve_command, serve_process

PROMPTS = ["once upon a time", "the quick brown fox", "a b c d e"]


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("nodes") / "llama", "llama", num_hidden_layers=4)


def completions(url: str) -> list[str]:
    body = {"model": MODEL, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    return [
        httpx.post(f"{url}/v1/completions", json={**body, "prompt": p}, timeout=120).json()["choices"][0]["text"]
        for p in PROMPTS
    ]


@contextlib.contextmanager
def headless_node(checkpoint, master_port: int, *flags: str):
    """Node 1: no API, its ranks for the leader on loopback; its output in a file."""
    command = serve_command(checkpoint, free_port(), "--headless", "--nnodes", "2", "--node-rank", "1",
                            "--master-addr", "127.0.0.1", "--master-port", str(master_port), *flags)  # fmt: skip
    with tempfile.TemporaryFile("w+") as log:
        popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            yield popen, log
        finally:
            popen.kill()
            popen.wait(30)


def leader_flags(master_port: int) -> list[str]:
    return ["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", str(master_port)]


def test_two_nodes_serve_the_one_process_servers_tokens_and_a_lost_rank_ends_the_leader(four_layers):
    with serve_process(four_layers) as alone:
        expected = completions(alone.url)
    master_port = free_port()
    stages = ["--pipeline-parallel-size", "2"]
    leader_command = [*stages, *leader_flags(master_port)]
    with (
        headless_node(four_layers, master_port, *stages) as (node, node_log),
        serve_process(four_layers, *leader_command) as leader,
    ):
        assert completions(leader.url) == expected
        # The start-up line comes from the driver, on the headless node, and the leader says it.
        assert "pipeline of 2 stages (stage 0: embedding, layers 0-1; stage 1: layers 2-3" in leader.output()
        [rank] = [pid for pid in children(node.pid) if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
        os.kill(rank, signal.SIGKILL)
        started = time.monotonic()
        failed = httpx.post(f"{leader.url}/v1/completions", json={"model": MODEL, "prompt": "x"}, timeout=60)
        assert failed.status_code == 500
        assert leader.popen.wait(30) == 70
        assert time.monotonic() - started < 15
        assert "rank 1 exited (code -9)" in leader.output(), leader.output()[-3000:]
        assert node.wait(30) == 1
        node_log.seek(0)
        assert "rank 1 exited" in node_log.read()
        wait_until(lambda: not alive(rank), 30, "the killed rank gone")
