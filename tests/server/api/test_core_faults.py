"""`argosy serve` is two processes. If the engine core dies, nothing hangs: what was in flight
ends at once with a 500 (or an error event in a stream), /health turns 503 and the server
exits non-zero so that Kubernetes restarts the pod. If the API process dies, the core follows."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path
from unittest import mock

import httpx
import zmq

from argosy.server.api.app import run_engine
from argosy.server.api.core_client import CoreClient
from argosy.server.api.metrics import ServerMetrics
from argosy.server.api.server_config import ServerConfig
from argosy.server.api.server_state import ServerState
from argosy.server.engine import core_protocol as protocol
from argosy.server.engine_config import EngineConfig
from tests.polling import wait_until
from tests.processes import MODEL, alive, children, serve_process
from tests.server.api.servers import run_server


def test_a_killed_core_fails_every_request_at_once_and_the_server_exits_non_zero(llama_checkpoint):
    body = {"model": MODEL, "prompt": "once upon a time", "max_tokens": 500, "ignore_eos": True}
    with serve_process(llama_checkpoint) as server:
        [core] = children(server.popen.pid)
        args = Path(f"/proc/{core}/cmdline").read_text().split("\0")
        sockets = Path(args[args.index("--commands") + 1].removeprefix("ipc://")).parent
        # Once the core is connected the socket files go: no exit, however abrupt, leaves them.
        wait_until(lambda: not sockets.exists(), what="the socket folder removed")
        streamed: list[list[str]] = []
        answered: list[httpx.Response] = []
        started = threading.Event()

        def stream() -> None:
            events = []
            with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        started.set()
            streamed.append(events)

        threads = [threading.Thread(target=stream)]
        threads.append(
            threading.Thread(
                target=lambda: answered.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=60))
            )
        )
        for t in threads:
            t.start()
        assert started.wait(30)
        os.kill(core, signal.SIGKILL)
        killed = time.monotonic()
        for t in threads:
            t.join(10)
        assert time.monotonic() - killed < 5 and not any(t.is_alive() for t in threads)
        error = json.loads(streamed[0][-2])["error"]
        assert streamed[0][-1] == "[DONE]" and error["type"] == "internal_error" and "engine core" in error["message"]
        assert answered[0].status_code == 500 and "engine core" in answered[0].json()["error"]["message"]
        assert httpx.get(f"{server.url}/health").status_code == 503
        assert httpx.get(f"{server.url}/live").status_code == 503
        refused = httpx.post(f"{server.url}/v1/completions", json=body)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "service_unavailable_error"
        assert server.popen.wait(10) == 70  # EX_SOFTWARE
        assert "engine core process exited with code -9" in server.output()


def test_the_core_exits_when_the_api_process_is_gone(llama_checkpoint):
    with serve_process(llama_checkpoint) as server:
        [core] = children(server.popen.pid)
        server.popen.kill()
        server.popen.wait(10)
        wait_until(lambda: not alive(core), 10, "the orphaned core to exit")


def test_a_failure_delivering_outputs_fails_what_is_in_flight_and_the_server_exits(llama_checkpoint):
    """Not only a failing step: whatever fails in the loop that delivers the core's outputs
    (here a metrics callback), the requests in flight end with an error, the server reports
    itself unhealthy and exits as for a dead core."""
    with run_server(llama_checkpoint) as server:
        core = server.state.client.core.process

        def broken(*args):
            raise RuntimeError("a metrics callback broke")

        server.state.metrics.observe_step = broken
        body = {"model": MODEL, "prompt": "once upon a time", "max_tokens": 50}
        answered = httpx.post(f"{server.url}/v1/completions", json=body, timeout=10)
        assert answered.status_code == 500 and "engine loop failed" in answered.json()["error"]["message"]
        assert server.state.exit_code == 70
        wait_until(lambda: core.poll() is not None, what="the core process gone")
        wait_until(lambda: not server.thread.is_alive(), what="the server to exit")


async def test_a_failure_between_the_core_starting_and_serving_fails_the_server(llama_checkpoint):
    """Not loading for ever: the server records why and its code (uvicorn then exits), and the
    core it started is gone."""
    config = ServerConfig(engine=EngineConfig(model=str(llama_checkpoint), dtype="float32", kv_cache_memory=8 << 20))
    state = ServerState(config, ServerMetrics("tiny"))
    started: list[CoreClient] = []
    real_init = CoreClient.__init__

    def record(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        started.append(self)

    def broken(*args):
        raise RuntimeError("binding the gauges broke")

    with mock.patch.object(CoreClient, "__init__", record), mock.patch.object(ServerMetrics, "bind_gauges", broken):
        await asyncio.wait_for(run_engine(state), 60)
    assert state.failure == "starting to serve failed: RuntimeError: binding the gauges broke"
    assert state.exit_code == 70 and state.client is None and not state.ready
    assert started[0].process.poll() is not None


def test_a_command_for_a_core_that_has_just_exited_is_dropped_rather_than_blocking(tmp_path):
    """A PUSH socket with nobody at the other end blocks on send for good: were the event loop
    to send a ping or a request there in the instant the core exits, the server would hang."""
    client = CoreClient.__new__(CoreClient)  # its socket alone: no core is started
    context = zmq.Context()
    client._commands = context.socket(zmq.PUSH)
    client._commands.bind(f"ipc://{tmp_path / 'commands'}")
    sent = threading.Thread(target=client.send, args=(protocol.Ping(),), daemon=True)
    sent.start()
    sent.join(5)
    assert not sent.is_alive(), "send blocked with no core to take the command"
    client._commands.close(linger=0)
    context.term()
