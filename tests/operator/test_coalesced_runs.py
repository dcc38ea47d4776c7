"""CoalescedRuns: an object's reconciles never overlap; requests made while one runs fold into
one more run after it; a caller who waits gets a run begun after its request; another object's
runs never wait on this one's."""

from __future__ import annotations

import threading

from argosy.operator.coalesced_runs import CoalescedRuns


class GatedRun:
    """A run that blocks until let go, counting its runs and how many overlap."""

    def __init__(self) -> None:
        self.started = threading.Semaphore(0)
        self.gate = threading.Semaphore(0)
        self.runs = self.active = self.most_active = 0
        self.lock = threading.Lock()

    def __call__(self) -> int:
        with self.lock:
            self.runs += 1
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            number = self.runs
        self.started.release()
        self.gate.acquire(timeout=10)
        with self.lock:
            self.active -= 1
        return number


def in_thread(target, *args) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(target(*args)), daemon=True)
    thread.start()
    return thread, result


def test_requests_during_a_run_fold_into_one_more_and_events_return_at_once():
    runs, run = CoalescedRuns(), GatedRun()
    first, first_result = in_thread(runs.request, "a", run, False)
    assert run.started.acquire(timeout=10)
    assert not runs.idle("a")
    assert [runs.request("a", run, False) for _ in range(5)] == [None] * 5  # at once, not run
    run.gate.release()  # the first run ends; the five fold into one more
    assert run.started.acquire(timeout=10)
    run.gate.release()
    first.join(10)
    assert first_result == [2] and run.runs == 2 and run.most_active == 1
    assert runs.idle("a")


def test_a_waiting_caller_gets_a_run_begun_after_its_request():
    runs, run = CoalescedRuns(), GatedRun()
    first, _ = in_thread(runs.request, "a", run, False)
    assert run.started.acquire(timeout=10)
    waiter, waited = in_thread(runs.request, "a", run, True)
    waiter.join(0.2)
    assert waiter.is_alive()  # the run going began before its request
    run.gate.release()
    assert run.started.acquire(timeout=10)
    run.gate.release()
    waiter.join(10)
    first.join(10)
    assert waited == [2]


def test_another_objects_run_does_not_wait():
    runs, slow, quick = CoalescedRuns(), GatedRun(), GatedRun()
    held, _ = in_thread(runs.request, "a", slow, False)
    assert slow.started.acquire(timeout=10)
    quick.gate.release()
    assert runs.request("b", quick, True) == 1
    slow.gate.release()
    held.join(10)


def test_a_failed_run_raises_to_its_waiters_and_frees_the_object():
    runs, run = CoalescedRuns(), GatedRun()
    calls = []

    def failing() -> int:
        calls.append(1)
        run()
        raise RuntimeError("API down")

    def raised(wait: bool) -> BaseException | None:
        try:
            runs.request("a", failing, wait)
        except RuntimeError as exc:
            return exc
        return None

    first, failed = in_thread(raised, False)
    assert run.started.acquire(timeout=10)
    waiter, waited = in_thread(raised, True)
    waiter.join(0.2)
    run.gate.release()
    first.join(10)
    waiter.join(10)
    assert len(calls) == 1 and "API down" in str(failed[0]) and waited[0] is failed[0]
    assert runs.idle("a")
    run.gate.release()
    assert runs.request("a", run, True) == 2  # the next request runs again
