"""The grammar compiles' queue as pure decisions: clients take turns, each bounded in what it runs
and what it may have pending; a withdrawn compile leaves the queue, a running one says so."""

from __future__ import annotations

import pytest

from argosy.server.exceptions import TooManyRequestsError
from argosy.server.structured.compile_queue import CompileQueue


def test_clients_take_turns_within_their_share_of_the_running_compiles():
    queue = CompileQueue(max_running=3, per_client_running=2, per_client_pending=8)
    for i in range(4):
        queue.add(f"a{i}", "a", "f")
    assert queue.start() == ["a0", "a1"]  # a's share, though a slot is free
    queue.add("b0", "b", "f")
    queue.add("b1", "b", "f")
    assert queue.start() == ["b0"]  # the free slot goes to the other client at once
    assert queue.remove("a0") is True  # finished or stopped: it was running
    assert queue.start() == ["a2"]  # a was served longer ago than b
    assert queue.remove("a3") is False and queue.pending("a") == 2  # withdrawn while queued
    queue.remove("a1")
    assert queue.start() == ["b1"]


def test_a_client_with_its_share_pending_gets_a_429_and_others_do_not():
    queue = CompileQueue(max_running=2, per_client_running=1, per_client_pending=3)
    for i in range(3):
        queue.add(f"a{i}", "a", "response_format")
    with pytest.raises(TooManyRequestsError) as refused:
        queue.add("a3", "a", "response_format")
    assert refused.value.status == 429 and refused.value.param == "response_format"
    queue.add("b0", "b", "response_format")
    queue.remove("a0")
    queue.add("a3", "a", "response_format")  # room again once one went


def test_the_offline_engine_is_bounded_by_the_running_compiles_alone():
    queue = CompileQueue(max_running=4, per_client_running=1, per_client_pending=2)
    for i in range(10):
        queue.add(f"k{i}", None, "f")
    assert queue.start() == ["k0", "k1", "k2", "k3"]
    assert queue.remove("k0") is True and queue.remove("k9") is False
    assert queue.start() == ["k4"] and queue.pending(None) == 8
