"""The watchdog's decisions, on the times it is given: a core owes a message while it holds work
(a step's end) and once pinged (the answer); it is hung once it owes one for longer than the
timeout, and not a moment before."""

from __future__ import annotations

from argosy.server.api.progress_watchdog import CONTROL_TIMEOUT, MAX_PING_INTERVAL, PING, Hang, ProgressWatchdog

TIMEOUT = 8.0


def test_an_idle_core_is_pinged_after_the_interval_and_hung_once_a_ping_goes_unanswered_too_long():
    dog = ProgressWatchdog(TIMEOUT, now=100.0)
    assert dog.ping_interval == 2.0 and dog.tick == 0.8
    assert dog.poll(101.9) is None and dog.stalled_seconds(101.9) == 0.0
    assert dog.poll(102.0) == PING
    assert dog.poll(102.1) is None  # one ping at a time
    assert dog.stalled_seconds(105.0) == 3.0
    assert dog.poll(110.0) is None  # exactly the timeout is still in time
    assert dog.poll(110.5) == Hang("ping", 8.5)
    assert dog.poll(200.0) == Hang("ping", 8.5) and dog.stalled_seconds(200.0) == 8.5  # it stands, frozen


def test_an_answered_ping_clears_the_debt_and_the_next_ping_waits_for_silence_again():
    dog = ProgressWatchdog(TIMEOUT, now=0.0)
    assert dog.poll(2.0) == PING
    dog.heard(9.0, holds_work=False)  # answered after 7 s: late, but within the timeout
    assert dog.poll(10.9) is None and dog.stalled_seconds(10.9) == 0.0
    assert dog.poll(11.0) == PING


def test_a_busy_core_owes_each_step_from_the_last_message_and_is_never_pinged():
    dog = ProgressWatchdog(TIMEOUT, now=0.0)
    dog.sent_work(1.0)
    assert dog.poll(8.9) is None  # silence past the ping interval, but a step is owed: no ping
    dog.heard(9.0, holds_work=True)  # a step of 8 s ended
    dog.sent_work(10.0)  # more work does not move the debt of the step in progress
    assert dog.poll(17.0) is None and dog.stalled_seconds(17.0) == 8.0
    assert dog.poll(17.5) == Hang("step", 8.5)


def test_a_control_command_has_its_own_limit_and_its_answer_clears_it():
    dog = ProgressWatchdog(TIMEOUT, now=0.0)
    dog.sent_control(1.0)  # a weight update: minutes of reading a checkpoint are no hang
    assert dog.poll(1.0 + 10 * TIMEOUT) is None
    assert dog.poll(1.0 + CONTROL_TIMEOUT + 1) == Hang("control", CONTROL_TIMEOUT + 1)
    dog = ProgressWatchdog(TIMEOUT, now=0.0)
    dog.sent_control(1.0)
    dog.heard(300.0, holds_work=False)
    dog.sent_work(301.0)  # back to steps: the step's limit again
    assert dog.poll(301.0 + TIMEOUT + 0.5) == Hang("step", TIMEOUT + 0.5)


def test_work_sent_to_a_pinged_core_keeps_the_pings_earlier_deadline():
    dog = ProgressWatchdog(TIMEOUT, now=0.0)
    assert dog.poll(2.0) == PING
    dog.sent_work(5.0)
    assert dog.poll(10.5) == Hang("ping", 8.5)


def test_a_core_that_finished_its_work_owes_nothing_more():
    dog = ProgressWatchdog(TIMEOUT, now=0.0)
    dog.sent_work(0.0)
    dog.heard(0.5, holds_work=False)
    assert dog.poll(2.4) is None and dog.stalled_seconds(2.4) == 0.0
    assert dog.poll(2.5) == PING


def test_long_timeouts_still_ping_every_few_seconds_and_poll_every_second():
    dog = ProgressWatchdog(120.0, now=0.0)
    assert dog.ping_interval == MAX_PING_INTERVAL and dog.tick == 1.0


def test_no_verdict_while_a_message_waits_unread():
    dog = ProgressWatchdog(TIMEOUT, now=0.0)
    dog.sent_work(0.0)
    assert dog.poll(9.0, unread=True) is None  # the loop was held up; the answer may be there
    dog.heard(9.1, holds_work=True)
    assert dog.poll(17.0) is None and dog.poll(17.2) == Hang("step", 17.2 - 9.1)
