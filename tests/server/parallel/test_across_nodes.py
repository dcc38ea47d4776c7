"""A model across nodes, as separate hosts would start it: the leader (`argosy serve --nnodes 2
--node-rank 0`) and a headless node (`--node-rank 1 --headless`), each its own process started
with the arguments the operator gives a LeaderWorkerSet's pods, LWS's variables (the leader's
address, the worker's index) expanded from the environment as the kubelet expands them; their
pipeline stages meet over gloo on loopback. Served completions give the one-process server's
greedy tokens, and a rank of the headless node killed ends the leader with that rank named,
within seconds."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from argosy.operator.leader_worker_set import build_leader_worker_set
from argosy.operator.owner import Owner
from argosy.operator.spec import InferenceServiceSpec
from argosy.server.executor.headless import node_ending
from argosy.server.executor.node_link import link_port
from tests.checkpoints import build_checkpoint
from tests.polling import wait_until
from tests.processes import MODEL, alive, children, free_port, free_port_pair, running, serve_command, serve_process

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


def pod_arguments(template: str) -> list[str]:
    """The arguments the operator gives the container of a LeaderWorkerSet's `template`
    (leaderTemplate or workerTemplate), for a model in two stages on CPU nodes."""
    spec = InferenceServiceSpec.model_validate(
        {"model": {"name": MODEL, "path": "llama"}, "engine": {"pipelineParallelSize": 2}}
    )
    owner = Owner(name="nodes", namespace="llm", uid="0c6f2a9e-5d1b-4e8a-9f3c-7b2d1e0a4c55", generation=1)
    lws = build_leader_worker_set(owner, spec)
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    return lws["spec"]["leaderWorkerTemplate"][template]["spec"]["containers"][0]["args"]


def kubelet_expanded(args: list[str], env: dict[str, str]) -> list[str]:
    """Each `$(NAME)` of a defined variable replaced by its value, as the kubelet expands arguments."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg) for arg in args]


def pod_command(checkpoint, template: str, worker_index: int, master_port: int) -> tuple[list[str], int]:
    """A pod of the group as LWS starts it: the operator's arguments with LWS's variables, then
    the test's checkpoint, ports and float32 settings (the last of a flag wins); and its port."""
    env = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_WORKER_INDEX": str(worker_index)}
    args = kubelet_expanded(pod_arguments(template), env)
    assert args[0] == "serve" and not any("$(" in arg for arg in args)
    port = free_port(avoid=(master_port, link_port(master_port)))
    ours = serve_command(checkpoint, port)  # python -P -m argosy serve, then the test's settings
    return [*ours[:5], *args[1:], *ours[5:], "--host", "127.0.0.1", "--master-port", str(master_port)], port


@contextlib.contextmanager
def headless_node(checkpoint, master_port: int):
    """Node 1, the group's worker pod: no API, its ranks for the leader on loopback; its output in a file."""
    command, _ = pod_command(checkpoint, "workerTemplate", 1, master_port)
    assert command[command.index("--node-rank") + 1] == "1" and "--headless" in command
    with tempfile.TemporaryFile("w+") as log:
        popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            yield popen, log
        finally:
            popen.kill()
            popen.wait(30)


@contextlib.contextmanager
def leader_pod(checkpoint, master_port: int):
    """Node 0, the group's leader: the API, healthy once every node's ranks are up."""
    command, port = pod_command(checkpoint, "leaderTemplate", 0, master_port)
    with running(command, f"http://127.0.0.1:{port}", "/health", "the leader to become healthy") as leader:
        yield leader


def tree(pid: int) -> list[int]:
    """`pid` and every process under it."""
    return [pid, *(p for child in children(pid) for p in tree(child))]


def test_two_nodes_serve_the_one_process_servers_tokens_and_a_lost_rank_ends_the_leader(four_layers):
    with serve_process(four_layers) as alone:
        expected = completions(alone.url)
    master_port = free_port_pair()
    with headless_node(four_layers, master_port) as (node, node_log), leader_pod(four_layers, master_port) as leader:
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


@pytest.mark.parametrize(
    ("signal_to_leader", "node_code"), [(signal.SIGTERM, 0), (signal.SIGKILL, 1)], ids=["stopped", "killed"]
)
def test_a_headless_node_ends_with_its_leader_failing_unless_it_was_stopped(four_layers, signal_to_leader, node_code):
    """A leader stopped (SIGTERM: it shuts its ranks and the nodes' down) ends the node with 0; a
    leader killed, every process of its pod at once as an OOM kill or a lost node does, ends it
    with 1 within seconds, though the node's ranks end quietly."""
    master_port = free_port_pair()
    with headless_node(four_layers, master_port) as (node, node_log), leader_pod(four_layers, master_port) as leader:
        pod = [leader.popen.pid] if signal_to_leader == signal.SIGTERM else tree(leader.popen.pid)
        for pid in pod:
            os.kill(pid, signal_to_leader)
        started = time.monotonic()
        assert node.wait(30) == node_code
        assert time.monotonic() - started < 15
        node_log.seek(0)
        assert ("the node stops" in node_log.read()) == bool(node_code)


@pytest.mark.parametrize(
    ("codes", "told", "gone", "expected"),
    [
        ([None, None], False, False, None),
        ([None, -9], False, False, (1, 1, "exited (code -9)")),
        ([0, 0], True, False, (0, None, "told to shut down by the leader")),
        ([0, None], True, False, None),
        ([0, None], True, True, (0, None, "told to shut down by the leader")),
        ([0, 0], False, False, (1, None, "a rank ended without the leader telling it to (the leader is gone)")),
        ([None, None], False, True, (1, None, "the leader closed its connection")),
        ([0, 1], True, True, (1, 1, "exited (code 1)")),
    ],
    ids=["serving", "rank-killed", "shut-down", "shutting-down", "leader-done", "quiet-exit", "leader-gone", "error"],
)
def test_a_node_ends_with_zero_only_when_the_leader_told_its_ranks_to_stop(codes, told, gone, expected):
    """Ranks whose leader died end quietly (code 0: their collectives lost a peer); the node must
    still fail, so that the group is restarted."""
    assert node_ending(codes, told, gone) == expected
