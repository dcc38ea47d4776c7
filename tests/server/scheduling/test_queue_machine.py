"""The scheduler's invariants under random traffic, as hypothesis state machines (one per policy,
with and without the host KV tier): every step within its token budget and seat cap (checked by
the simulation), admissions in the order of the queue's places (so no request waits past the
aging bound the places encode), every block held by a running sequence and none lost, the host
tier within its size, and everything returned once every request is done or aborted."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.server.scheduling.simulation import Simulation

PREFIXES = [[], list(range(100, 109)), list(range(200, 213))]  # shared prefixes: prefix and tier hits
HOST_BLOCKS = 12


def machine(policy: str, host_blocks: int) -> type[RuleBasedStateMachine]:
    class SchedulerMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.sim = Simulation(
                policy, num_blocks=20, max_num_seqs=3, max_num_batched_tokens=16, host_blocks=host_blocks
            )
            self.names = iter(range(10**6))

        @rule(
            prefix=st.sampled_from(PREFIXES),
            tail=st.lists(st.integers(1, 50), min_size=1, max_size=12),
            max_tokens=st.integers(1, 12),
            priority=st.integers(0, 3),
            user=st.sampled_from(["a", "b", "c"]),
        )
        def add(self, prefix, tail, max_tokens, priority, user):
            priority = priority if policy == "priority" else 0
            self.sim.add(str(next(self.names)), 0, max_tokens, priority, user, prompt=prefix + tail)

        @rule()
        def step(self):
            scheduler = self.sim.scheduler
            was_waiting = set(map(id, scheduler.waiting))
            self.sim.step()
            if policy == "fair":
                return
            admitted = [seq for seq in scheduler.running if id(seq) in was_waiting]
            place = scheduler.waiting.place
            for seq in admitted:  # nothing left waiting was ahead of what went in
                assert all(place(seq) < place(other) for other in scheduler.waiting), (seq, list(scheduler.waiting))

        @precondition(lambda self: self.sim.scheduler.has_work())
        @rule(data=st.data())
        def abort(self, data):
            scheduler = self.sim.scheduler
            seq = data.draw(st.sampled_from([*scheduler.running, *scheduler.waiting]))
            scheduler.finish(seq)

        @invariant()
        def blocks_are_held_by_running_sequences_only(self):
            scheduler, kv = self.sim.scheduler, self.sim.kv
            held = {block for seq in scheduler.running for block in seq.block_table}
            assert all(not seq.block_table for seq in scheduler.waiting)
            assert kv.num_used_blocks == len(held)
            if kv.connector is not None:
                assert len(kv.connector.pool) <= HOST_BLOCKS

        def teardown(self):
            scheduler = self.sim.scheduler
            for seq in [*scheduler.running, *scheduler.waiting]:
                scheduler.finish(seq)
            assert self.sim.kv.num_used_blocks == 0

    SchedulerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    return SchedulerMachine


TestFcfs = machine("fcfs", 0).TestCase
TestPriority = machine("priority", 0).TestCase
TestFair = machine("fair", 0).TestCase
TestFcfsWithTier = machine("fcfs", HOST_BLOCKS).TestCase
TestPriorityWithTier = machine("priority", HOST_BLOCKS).TestCase
