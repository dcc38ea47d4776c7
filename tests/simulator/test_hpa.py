"""The HPA emulation against the algorithm's documentation (kubernetes.io, "Horizontal Pod
Autoscaling": the formula, the tolerance, stabilisation, and the scaling-policy examples)."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.simulator.hpa import (
    Behavior,
    HorizontalPodAutoscaler,
    ScalingPolicy,
    ScalingRules,
    average_value_replicas,
)


def test_the_documented_formula_doubles_and_halves():
    # "if the current metric value is 200m, and the desired value is 100m, the number of replicas
    # will be doubled"; at 50m, halved. With an AverageValue target the current value is total / replicas.
    assert average_value_replicas(total=4 * 0.2, target=0.1, current=4) == 8
    assert average_value_replicas(total=4 * 0.05, target=0.1, current=4) == 2


def test_within_the_tolerance_nothing_changes():
    assert average_value_replicas(total=10 * 5 * 1.09, target=5, current=10) == 10
    assert average_value_replicas(total=10 * 5 * 0.91, target=5, current=10) == 10
    assert average_value_replicas(total=10 * 5 * 1.11, target=5, current=10) == math.ceil(10 * 5 * 1.11 / 5)


def test_the_largest_proposal_of_the_metrics_wins():
    hpa = HorizontalPodAutoscaler(1, 20, Behavior(scale_up=ScalingRules(0, (ScalingPolicy("Pods", 100, 15),))))
    assert hpa.reconcile(0, 2, [(2 * 5, 5), (30, 5)]) == 6


def test_the_default_scale_up_is_100_percent_or_4_pods_per_15_seconds():
    hpa = HorizontalPodAutoscaler(1, 100)
    assert hpa.reconcile(0, 1, [(1000, 1)]) == 5  # max(1 + 100%, 1 + 4)
    assert hpa.reconcile(10, 5, [(1000, 1)]) == 5  # the period's 4 pods are spent
    assert hpa.reconcile(16, 5, [(1000, 1)]) == 10  # a new period: 100% of 5
    assert hpa.reconcile(32, 10, [(1000, 1)]) == 20


def test_scale_down_waits_for_the_stabilisation_window():
    hpa = HorizontalPodAutoscaler(1, 100)  # default: 300 s window
    assert hpa.reconcile(0, 10, [(50, 5)]) == 10
    for t in range(15, 300, 15):
        assert hpa.reconcile(t, 10, [(5, 5)]) == 10  # the recommendation of 10 at t=0 is still in the window
    assert hpa.reconcile(301, 10, [(5, 5)]) == 1


def test_the_scale_up_window_takes_the_lowest_recent_recommendation():
    behavior = Behavior(scale_up=ScalingRules(60, (ScalingPolicy("Percent", 1000, 15),)))
    hpa = HorizontalPodAutoscaler(1, 100, behavior)
    assert hpa.reconcile(0, 2, [(4, 1)]) == 4
    assert hpa.reconcile(15, 4, [(40, 1)]) == 4  # 4 was recommended within 60 s
    assert hpa.reconcile(61, 4, [(40, 1)]) == 40


def test_the_documented_scale_down_policies_example():
    # "policies: Pods 4 per 60 s and Percent 10 per 60 s": from 80 replicas the Percent policy removes
    # 8, then 10% of 72 (7.2, rounded to 8), ...; below 40 replicas the Pods policy's 4 is the larger.
    behavior = Behavior(scale_down=ScalingRules(0, (ScalingPolicy("Pods", 4, 60), ScalingPolicy("Percent", 10, 60))))
    hpa = HorizontalPodAutoscaler(1, 100, behavior)
    replicas, t, seen = 80, 0.0, [80]
    while replicas > 10:
        replicas = hpa.reconcile(t, replicas, [(0, 1)])
        seen.append(replicas)
        t += 61
    assert seen[:3] == [80, 72, 64]
    steps = [a - b for a, b in itertools.pairwise(seen)]
    assert all(step == 4 for before, step in zip(seen, steps) if before <= 40)
    assert all(step >= 4 for step in steps)


def test_the_policies_count_the_changes_within_their_period():
    behavior = Behavior(scale_down=ScalingRules(0, (ScalingPolicy("Pods", 1, 60),)))
    hpa = HorizontalPodAutoscaler(1, 100, behavior)
    assert hpa.reconcile(0, 10, [(0, 1)]) == 9
    assert hpa.reconcile(30, 9, [(0, 1)]) == 9
    assert hpa.reconcile(61, 9, [(0, 1)]) == 8


def test_select_policy_min_and_disabled():
    up = ScalingRules(0, (ScalingPolicy("Pods", 2, 15), ScalingPolicy("Percent", 100, 15)), "Min")
    assert HorizontalPodAutoscaler(1, 100, Behavior(scale_up=up)).reconcile(0, 10, [(1000, 1)]) == 12
    off = ScalingRules(0, (ScalingPolicy("Pods", 2, 15),), "Disabled")
    assert HorizontalPodAutoscaler(1, 100, Behavior(scale_down=off)).reconcile(0, 10, [(0, 1)]) == 10


def test_replicas_outside_the_bounds_are_brought_in_first():
    hpa = HorizontalPodAutoscaler(2, 5)
    assert hpa.reconcile(0, 9, [(0, 1)]) == 5
    assert hpa.reconcile(0, 1, [(1000, 1)]) == 2
    assert hpa.reconcile(0, 0, [(1000, 1)]) == 0  # at 0 the HPA is off: KEDA activates


def test_behavior_from_a_manifest_keeps_the_defaults_it_leaves_out():
    behavior = Behavior.from_manifest({"scaleDown": {"stabilizationWindowSeconds": 60}})
    assert behavior.scale_down.stabilization_window_seconds == 60
    assert behavior.scale_down.policies == (ScalingPolicy("Percent", 100, 15),)
    assert behavior.scale_up == Behavior().scale_up


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(0, 30),
    st.lists(st.tuples(st.floats(0, 500), st.floats(1, 30)), min_size=1, max_size=40),
)
def test_never_outside_min_and_max(minimum, extra, loads):
    maximum = minimum + extra
    hpa = HorizontalPodAutoscaler(minimum, maximum)
    replicas = minimum
    for i, (total, seconds) in enumerate(loads):
        replicas = hpa.reconcile(i * seconds, replicas, [(total, 5)])
        assert minimum <= replicas <= maximum
