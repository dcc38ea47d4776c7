"""A hung engine core is a failed one. Stopped with SIGSTOP (what a stuck device call, a
collective that never returns or a deadlock looks like from outside), busy or idle, it is
caught within --engine-step-timeout: what was in flight ends with a 500 (an error event in a
stream), /health and /live turn 503, the core's process group is killed and the server exits
70. A drain does not wait for a stopped core for ever, and a long step that is only slow is
never taken for a hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from argosy.server.api.core_client import SHUTDOWN_WAIT_S
from argosy.server.api.metrics import STEP_BUCKETS
from argosy.server.api.progress_watchdog import ProgressWatchdog
from argosy.server.engine_config import DEFAULT_BATCHED_TOKENS
from argosy.server.models.default_model import DEFAULT_MODEL_NAME
from tests.checkpoints import build_checkpoint
from tests.polling import wait_until
from tests.processes import MODEL, alive, children, process_group, serve_process
from tests.server.api.servers import metric, run_server, stream_in_background

STEP_TIMEOUT = 3.0
# Beyond the timeout: the watchdog's poll (a tenth of it), killing the core, the error's way
# to the client, and a loaded machine.
MARGIN = 5.0
PING_INTERVAL = ProgressWatchdog(STEP_TIMEOUT, 0.0).ping_interval
STREAM_TOKENS = 3000
LONGEST_STEP = DEFAULT_BATCHED_TOKENS // 2


@pytest.fixture(scope="module")
def long_context_checkpoint(tmp_path_factory):
    """The tiny test model with room for a stream that outlasts any test's reaction to it."""
    return build_checkpoint(tmp_path_factory.mktemp("long") / "llama", "llama", max_position_embeddings=4096)


def assert_nothing_left(core: int) -> None:
    assert not alive(core) and process_group(core) == []


def stop_core_mid_stream(server) -> tuple[int, threading.Thread, list[list[str]]]:
    """Starts a long stream and stops the server's engine core once its first tokens came:
    (the core's pid, the stream's thread, where its events go when it ends)."""
    [core] = children(server.popen.pid)
    results: list[list[str]] = []
    started = threading.Event()
    thread = stream_in_background(server.url, STREAM_TOKENS, results, started)
    assert started.wait(30)
    os.kill(core, signal.SIGSTOP)
    return core, thread, results


def test_a_core_stopped_during_a_stream_fails_it_within_the_timeout_and_the_server_exits_70(
    long_context_checkpoint,
):
    with serve_process(long_context_checkpoint, "--engine-step-timeout", str(STEP_TIMEOUT)) as server:
        core, thread, results = stop_core_mid_stream(server)
        stopped = time.monotonic()
        thread.join(STEP_TIMEOUT + MARGIN)
        failed_after = time.monotonic() - stopped
        assert not thread.is_alive(), "the stream hung"
        health, live = httpx.get(f"{server.url}/health"), httpx.get(f"{server.url}/live")
        assert STEP_TIMEOUT - 0.5 < failed_after < STEP_TIMEOUT + MARGIN
        [events] = results
        error = json.loads(events[-2])["error"]
        assert events[-1] == "[DONE]" and error["type"] == "internal_error"
        assert error["message"].startswith("the engine core hung: step ")
        assert health.status_code == 503 and health.json()["status"] == error["message"]
        assert live.status_code == 503
        assert server.popen.wait(10) == 70
        assert_nothing_left(core)
        # The log says which step hung and for how long.
        assert f"the engine core hung: step {error['message'].split()[5]} has not finished after" in server.output()


def test_a_core_stopped_while_idle_is_caught_by_a_ping(llama_checkpoint):
    with serve_process(llama_checkpoint, "--engine-step-timeout", str(STEP_TIMEOUT)) as server:
        [core] = children(server.popen.pid)
        os.kill(core, signal.SIGSTOP)
        stopped = time.monotonic()
        assert server.popen.wait(PING_INTERVAL + STEP_TIMEOUT + MARGIN) == 70
        assert time.monotonic() - stopped > STEP_TIMEOUT
        assert "the engine core hung: it answered no ping for " in server.output()
        assert_nothing_left(core)


def test_a_hang_is_counted_and_its_stall_shown_in_the_metrics(long_context_checkpoint):
    """In this process (so that the metrics can be read after the server stopped), with the
    engine core its own process as always: a non-streamed request gets the 500 as a JSON body."""
    with run_server(long_context_checkpoint, engine_step_timeout=STEP_TIMEOUT) as server:
        assert metric(server.url, "argosy_engine_stall_seconds") == 0
        core = server.engine.core
        answers: list[httpx.Response] = []
        body = {"model": MODEL, "prompt": "once upon a time", "max_tokens": STREAM_TOKENS, "ignore_eos": True}
        thread = threading.Thread(
            target=lambda: answers.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=60))
        )
        thread.start()
        # Two steps done at least (on a loaded machine the first can take a while): both counted below.
        running = lambda: server.engine.num_running == 1 and metric(server.url, "argosy_engine_steps_total") >= 2  # noqa: E731
        wait_until(running, what="the request to run")
        os.kill(core.pid, signal.SIGSTOP)
        thread.join(STEP_TIMEOUT + MARGIN)
        assert not thread.is_alive(), "the request hung"
        [answer] = answers
        assert answer.status_code == 500 and answer.json()["error"]["type"] == "internal_error"
        assert "has not finished after" in answer.json()["error"]["message"]
        wait_until(lambda: not server.thread.is_alive(), what="the server to exit")
    assert server.state.exit_code == 70 and core.process.poll() is not None
    samples = {
        (s.name, s.labels.get("waiting_for")): s.value
        for family in text_string_to_metric_families(server.state.metrics.render().decode())
        for s in family.samples
    }
    assert samples["argosy_engine_hangs_total", "step"] == 1 and samples["argosy_engine_hangs_total", "ping"] == 0
    assert STEP_TIMEOUT < samples["argosy_engine_stall_seconds", None] < STEP_TIMEOUT + MARGIN
    assert samples["argosy_engine_steps_total", None] == samples["argosy_engine_step_duration_seconds_count", None] > 1


def test_sigterm_while_the_core_is_stopped_does_not_wait_for_ever(long_context_checkpoint):
    """A drain shorter than the step timeout: the drain gives up on the stream (an error
    event), the stopped core is killed when it does not answer the shutdown, and the server
    exits, leaving nothing behind."""
    shutdown_timeout = 2
    flags = ("--engine-step-timeout", "60", "--shutdown-timeout", str(shutdown_timeout))
    with serve_process(long_context_checkpoint, *flags) as server:
        core, thread, results = stop_core_mid_stream(server)
        server.popen.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert server.popen.wait(shutdown_timeout + SHUTDOWN_WAIT_S + MARGIN) == 0
        assert time.monotonic() - signalled > shutdown_timeout
        thread.join(5)
        [events] = results
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "shutting_down"
        assert "did not stop within" in server.output()
        assert_nothing_left(core)


def timed_long_prompt(server_url: str, prompt_tokens: int) -> float:
    """Serves one prompt of `prompt_tokens` while four streams decode; returns its seconds."""
    results: list[list[str]] = []
    streams = [stream_in_background(server_url, 16, results, model=DEFAULT_MODEL_NAME) for _ in range(4)]
    body = {"model": DEFAULT_MODEL_NAME, "prompt": list(range(1000, 1000 + prompt_tokens)), "max_tokens": 1}
    started = time.monotonic()
    answer = httpx.post(f"{server_url}/v1/completions", json=body, timeout=600)
    seconds = time.monotonic() - started
    for stream in streams:
        stream.join(600)
    assert answer.status_code == 200, answer.text
    assert [events[-1] for events in results] == ["[DONE]"] * 4
    assert all("error" not in events[-2] for events in results)
    return seconds


@pytest.mark.slow
def test_a_long_step_that_is_only_slow_is_never_taken_for_a_hang():
    """A prompt of max_num_batched_tokens (half the default: the longest step either way) on the
    default model, on this CPU while four streams decode and another process spins on one of its
    two cores: timed first under a timeout that cannot fire, then served again with the step
    timeout at three times that."""
    hogs = [subprocess.Popen([sys.executable, "-P", "-c", "while True: pass"]) for _ in range(1)]
    try:
        server_flags = {
            "served_model_name": None,
            "dtype": "auto",
            "kv_cache_memory": None,
            "max_num_batched_tokens": LONGEST_STEP,
        }
        with run_server(None, engine_step_timeout=3600, **server_flags) as server:
            slowest = timed_long_prompt(server.url, LONGEST_STEP)
        timeout = 3 * slowest
        with run_server(None, engine_step_timeout=timeout, **server_flags) as server:
            timed_long_prompt(server.url, LONGEST_STEP)
            assert server.state.client.healthy and server.state.failure is None
            assert metric(server.url, "argosy_engine_hangs_total", DEFAULT_MODEL_NAME, waiting_for="step") == 0
            # The step was long against the timeout: some step took more than a tenth of it.
            buckets = [b for b in STEP_BUCKETS if b <= timeout / 10]
            total = metric(server.url, "argosy_engine_step_duration_seconds_count", DEFAULT_MODEL_NAME)
            quick = metric(
                server.url, "argosy_engine_step_duration_seconds_bucket", DEFAULT_MODEL_NAME, le=str(buckets[-1])
            )
            assert total > quick, f"no step took over {buckets[-1]} s of a {timeout:.1f} s timeout"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
