"""The scheduling policies as pure scheduler decisions, driven without a model: the waiting
order of each, priority's aging bound and its preemptions (by the sequence cap and by memory,
never before MIN_RUN_STEPS), a preempted request's place, fair shares between users, and the
budgets and blocks every step keeps."""

from __future__ import annotations

import random

import pytest

from argosy.server.scheduling.policy import AGING_STEPS, MIN_RUN_STEPS
from tests.server.scheduling.simulation import Simulation


def order(sim: Simulation) -> list[str]:
    return [seq.request.request_id for seq in sim.scheduler.waiting.ordered()]


def test_fcfs_admits_by_arrival_whatever_the_priority_field():
    sim = Simulation("fcfs", max_num_seqs=1)
    for name, priority in (("a", 3), ("b", 0), ("c", 1)):
        sim.add(name, 4, 2, priority=priority)
    assert order(sim) == ["a", "b", "c"]


def test_priority_orders_by_priority_then_arrival():
    sim = Simulation("priority", max_num_seqs=1)
    for name, priority in (("a", 3), ("b", 0), ("c", 1), ("d", 0)):
        sim.add(name, 4, 2, priority=priority)
    assert order(sim) == ["b", "d", "c", "a"]


def test_waiting_ages_a_request_ahead_of_later_arrivals_of_any_priority():
    """A priority-10 request is ahead of every priority-0 request arriving 10 x AGING_STEPS steps
    after it or later, and behind those arriving sooner."""
    sim = Simulation("priority", max_num_seqs=1)
    sim.add("running", 4, 100_000)
    sim.step()
    sim.add("low", 4, 2, priority=10)
    sim.run(10 * AGING_STEPS - 1)  # the running request holds the only seat meanwhile
    sim.add("sooner", 4, 2, priority=0)
    sim.step()
    sim.add("later", 4, 2, priority=0)
    assert order(sim) == ["sooner", "low", "later"]


def test_under_a_flood_of_higher_priority_no_request_waits_past_its_aging_bound():
    sim = Simulation("priority", max_num_seqs=2, num_blocks=256)
    sim.add("low", 8, 4, priority=5)
    for step in range(12 * AGING_STEPS):
        if step % 2 == 0:  # more than the two seats can serve: the queue only grows
            sim.add(f"flood-{step}", 8, 6, priority=0)
        sim.step()
        if "low" in sim.admitted_at:
            break
    # Ahead of it: only floods that arrived within 5 x AGING_STEPS steps of it, served in turn.
    assert "low" in sim.admitted_at and sim.admitted_at["low"] <= 12 * AGING_STEPS


def test_a_higher_priority_preempts_for_a_seat_at_once_and_the_victim_again_only_after_min_run_steps():
    sim = Simulation("priority", max_num_seqs=1)
    sim.add("a", 4, 1000, priority=5)
    sim.step()
    sim.add("u1", 4, 3, priority=0)
    sim.step()
    assert sim.admitted_at["u1"] == sim.scheduler.steps  # a had never given way: it does at once
    while "u1" not in sim.finished_at:
        sim.step()
    sim.step()
    (a,) = sim.scheduler.running
    returned = a.admitted_step
    assert a.request.request_id == "a" and returned == sim.scheduler.steps
    sim.add("u2", 4, 3, priority=0)
    while "u2" not in sim.admitted_at:
        sim.step()
    # Preempted for priority once, a runs MIN_RUN_STEPS steps after its return before it gives way again.
    assert sim.admitted_at["u2"] == returned + MIN_RUN_STEPS
    assert sim.scheduler.preemptions == {"memory": 0, "priority": 2}


def test_a_jumping_request_s_first_step_carries_it_and_the_decodes_only():
    sim = Simulation("priority", max_num_seqs=4, max_num_batched_tokens=16)
    sim.add("decode", 4, 100, priority=10)
    sim.add("long", 64, 4, priority=10)  # 12 of its tokens go in the first step, 16 in each after
    sim.step()
    sim.add("urgent", 8, 2, priority=0)
    sim.add("later", 4, 2, priority=10)
    sim.step()
    assert {item.seq.request.request_id: item.num_new_tokens for item in sim.last.scheduled} == {
        "decode": 1,
        "urgent": 8,
    }
    sim.step()
    assert {item.seq.request.request_id for item in sim.last.scheduled} == {"decode", "urgent", "long"}
    assert order(sim) == ["later"]  # long's chunk took the rest of the budget


def test_a_higher_priority_preempts_for_blocks():
    sim = Simulation("priority", num_blocks=10, max_num_seqs=8)  # 10 blocks of 4 tokens
    sim.add("big", 24, 1000, priority=3)  # 6 blocks, growing to 9 in MIN_RUN_STEPS + 1 steps
    sim.run(MIN_RUN_STEPS + 1)
    sim.add("urgent", 12, 2, priority=0)  # 3 blocks: not free
    sim.step()
    assert sim.admitted_at.get("urgent") == sim.scheduler.steps
    assert sim.scheduler.preemptions["priority"] == 1 and order(sim) == ["big"]
    sim.run(5)
    assert "urgent" in sim.finished_at and "big" not in order(sim)  # back once there was room


def test_equal_or_better_running_sequences_are_never_preempted_for_priority():
    sim = Simulation("priority", max_num_seqs=1)
    sim.add("a", 4, 200, priority=1)
    sim.run(MIN_RUN_STEPS + 2)
    sim.add("b", 4, 2, priority=1)
    sim.run(50)
    assert sim.scheduler.preemptions["priority"] == 0 and "b" not in sim.admitted_at


def test_a_preempted_request_keeps_its_place_ahead_of_later_arrivals_of_its_priority():
    sim = Simulation("priority", max_num_seqs=1)
    sim.add("a", 4, 1000, priority=2)
    sim.run(MIN_RUN_STEPS + 1)
    sim.add("later", 4, 2, priority=2)
    sim.add("urgent", 4, 50, priority=0)
    sim.run(2)
    assert sim.scheduler.preemptions["priority"] == 1 and order(sim) == ["a", "later"]


def test_fair_shares_admit_the_least_served_user_first_and_a_lone_user_gets_everything():
    sim = Simulation("fair", max_num_seqs=2, num_blocks=256)
    for i in range(12):
        sim.add(f"heavy-{i}", 8, 8, user="heavy")
    sim.run(30)
    assert set(sim.served) == {"heavy"} and len(sim.finished_at) >= 4  # alone: both seats, all along
    for i in range(8):
        sim.add(f"light-{i}", 8, 8, user="light")
    sim.served.clear()
    while any(f"light-{i}" not in sim.finished_at for i in range(8)):
        sim.step()
    # Half the tokens each while both had work (the heavy user's started with both seats).
    assert sim.served["light"] / (sim.served["light"] + sim.served["heavy"]) >= 0.45


def test_fair_admissions_in_one_step_alternate_between_users():
    sim = Simulation("fair", max_num_seqs=6, num_blocks=256)
    for i in range(10):
        sim.add(f"heavy-{i}", 8, 4, user="heavy")
    for i in range(3):
        sim.add(f"light-{i}", 8, 4, user="light")
    sim.step()  # each admission is charged as it is made: the next comes from the other user
    assert sorted(item.seq.request.user for item in sim.last.scheduled) == ["heavy"] * 3 + ["light"] * 3


def test_a_user_back_from_idle_starts_level_and_banks_no_credit():
    sim = Simulation("fair", max_num_seqs=1, num_blocks=256)
    sim.add("a-0", 8, 4, user="a")
    sim.run(10)
    for i in range(4):
        sim.add(f"b-{i}", 8, 40, user="b")
    sim.run(400)  # b alone for long: a, idle meanwhile, must not get as many turns in a row
    sim.add("b-late", 8, 4, user="b")
    for i in range(3):
        sim.add(f"a-{i + 1}", 8, 4, user="a")
    shares = sim.scheduler.waiting.shares
    assert shares.served("a") >= shares.served("b") - 1000  # lifted to b's level, not left far behind


def test_fair_shares_remember_a_bounded_number_of_idle_users_and_a_forgotten_one_starts_level():
    sim = Simulation("fair", max_num_seqs=2, num_blocks=256)
    shares = sim.scheduler.waiting.shares
    shares.max_idle_users = 3
    sim.add("steady-0", 8, 400, user="steady")
    for i in range(40):  # one-off users, each done before the next comes
        sim.add(f"once-{i}", 8, 2, user=f"user-{i}")
        while f"once-{i}" not in sim.finished_at:
            sim.step()
        assert shares.num_users <= 1 + 1 + 3  # steady, the one in flight, the three last idle
    assert shares.served("user-0") == 0.0  # forgotten
    sim.add("back", 8, 2, user="user-0")  # starts level with the least-served active user
    assert shares.served("user-0") == shares.served("steady")


@pytest.mark.parametrize("policy", ["fcfs", "priority", "fair"])
def test_random_traffic_keeps_the_budgets_and_returns_every_block(policy):
    rng = random.Random(policy)
    sim = Simulation(policy, num_blocks=24, max_num_seqs=4, max_num_batched_tokens=32)
    for i in range(60):
        sim.add(f"r{i}", rng.randrange(1, 30), rng.randrange(1, 20),
                priority=rng.randrange(4) if policy == "priority" else 0, user=rng.choice("xyz"))  # fmt: skip
        for _ in range(rng.randrange(3)):
            sim.step()
    while sim.scheduler.has_work():
        sim.step()
        assert sim.scheduler.steps < 5000
    assert len(sim.finished_at) == 60 and sim.kv.num_used_blocks == 0
