"""The scheduling policies (`--scheduling-policy`) and the rules they keep, as numbers.

- fcfs: by arrival; a preempted sequence keeps its place (ahead of every later arrival).
- priority: by a request's `priority` (lower first, as vLLM), aged by waiting: a request's place
  is its arrival step plus AGING_STEPS per priority level, so one of priority p is ahead of any
  request of priority q < p that arrives (p - q) x AGING_STEPS steps after it or later. No
  flood holds a request back past that. A waiting request that cannot be admitted (no blocks,
  or the sequence cap) preempts the running sequence furthest behind it; one that was preempted
  for priority before only once it has run MIN_RUN_STEPS steps since its return: a sequence
  preempted for priority always makes progress before it can be preempted again, so requests
  never take turns evicting each other. A waiting request ahead of running ones jumps: the
  step that admits it carries it and the running decodes, the prefill chunks behind it and
  other admissions waiting a step, so that its first token comes from a short step.
- fair: by the tokens each `user` has been served (prompt tokens plus OUTPUT_WEIGHT per output
  token), the least-served user with work first; work conserving (one user alone gets all)."""

from __future__ import annotations

from typing import Literal

SchedulingPolicy = Literal["fcfs", "priority", "fair"]
AGING_STEPS = 64  # steps of waiting worth one priority level
MIN_RUN_STEPS = 8  # steps a sequence preempted for priority runs after its return before it may be again
MAX_IDLE_USERS = 4096  # idle users whose fair-share counts are remembered, the longest idle forgotten first
MAX_USER_LENGTH = 256  # characters of a request's `user`: the fair policy keeps the name
OUTPUT_WEIGHT = 2  # an output token's cost against a prompt token's, in fair shares (a decode step
# computes one token for a sequence, a prefill step many)
