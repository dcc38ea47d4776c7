"""Simulated fleets: replicas on the profile's clock, and the autoscaling a cluster would do."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.server.profile.step_shape import StepShape
from argosy.simulator.simulation import Simulation, SimulationConfig
from argosy.simulator.summary import Objectives
from argosy.simulator.trace import TraceRequest
from argosy.simulator.workload import generate
from tests.simulator.conftest import service

OBJECTIVES = Objectives(ttft_seconds=2.0, itl_seconds=0.1)


def run(profile, trace, spec, **options):
    return Simulation(SimulationConfig(profile, trace, spec, OBJECTIVES, **options)).run()


def test_a_lone_request_runs_on_the_profile_clock(profile):
    result = run(profile, [TraceRequest(3.0, prompt_tokens=100, output_tokens=5)], service())
    request = result.requests[0]
    prefill = profile.step_seconds(StepShape(1, 100, 100 * 101 / 2 / 1000, 0, 0, 1))
    assert request.error is None and request.tokens == 5
    assert request.ttft == pytest.approx(prefill)
    decodes = [profile.step_seconds(StepShape(1, 0, 0, 1, 101 + i, 1)) for i in range(4)]
    assert request.gaps == pytest.approx(decodes)
    assert result.summary.errors == 0 and result.summary.scale_events == 0


def test_requests_join_the_running_batch(profile):
    # Eight requests at once: the first wakes the replica and runs alone; the seven queued behind it
    # join in the next step, their prompts beside its first decode, then all eight decode together.
    trace = [TraceRequest(0.0, 100, 3) for _ in range(8)]
    result = run(profile, trace, service())
    first = profile.step_seconds(StepShape(1, 100, 100 * 101 / 2 / 1000, 0, 0, 1))
    joined = profile.step_seconds(StepShape(1, 700, 7 * 100 * 101 / 2 / 1000, 1, 101, 8))
    assert [r.ttft for r in result.requests] == pytest.approx([first] + [first + joined] * 7)
    together = profile.step_seconds(StepShape(1, 0, 0, 8, 7 * 101 + 102, 8))
    assert result.requests[1].gaps == pytest.approx([together, profile.step_seconds(StepShape(1, 0, 0, 7, 7 * 102, 7))])


def test_the_fleet_scales_up_under_load_and_back_down(profile):
    trace = generate("poisson:rate=6,duration=300,prompt=400,output=100,seed=1")
    spec = service(minReplicas=1, maxReplicas=4, targetWaitingRequests=2, scaleDownStabilizationSeconds=60)
    result = run(profile, trace, spec, pod_start_seconds=30, until=900)
    ups = [e for e in result.scale_events if e[2] > e[1]]
    downs = [e for e in result.scale_events if e[2] < e[1]]
    assert ups and downs and ups[0][0] < downs[0][0]
    assert result.summary.max_replicas == 4
    assert max(result.timeline.replicas) <= 4
    assert result.timeline.replicas[-1] == 1 and result.timeline.starting[-1] == 0
    assert all(r.done for r in result.requests)


def test_the_fleet_scales_down_when_demand_is_gone_even_with_pods_pending(profile):
    # A burst asks for pods that take twenty minutes to start; the demand is gone long before.
    trace = generate("poisson:rate=10,duration=60,prompt=400,output=50,seed=2")
    spec = service(minReplicas=1, maxReplicas=6, targetWaitingRequests=2)
    result = run(profile, trace, spec, pod_start_seconds=1200, until=720)
    assert result.summary.max_replicas > 1
    assert max(result.timeline.ready) == 1  # none of the new pods ever started
    assert result.timeline.replicas[-1] == 1 and result.timeline.starting[-1] == 0


def test_a_fixed_fleet_never_scales(profile):
    trace = generate("poisson:rate=3,duration=60,prompt=200,output=20,seed=3")
    result = run(profile, trace, service(), until=120)
    assert result.summary.scale_events == 0 and set(result.timeline.replicas) == {1}


def test_scale_from_zero_on_the_requests_the_router_holds(profile):
    spec = service(minReplicas=0, maxReplicas=2, pollingIntervalSeconds=5, scaleDownStabilizationSeconds=60)
    spec = spec.model_copy(update={"routing": _picker()})
    trace = [TraceRequest(100.0, 50, 5)]
    result = run(profile, trace, spec, pod_start_seconds=20, until=400)
    request = result.requests[0]
    # At 0 replicas it is held; KEDA sees it at its next poll (and scrape), a pod starts, then serves it.
    assert request.error is None and 20 < request.ttft < 20 + 5 + 15 + 10 + 1
    assert result.timeline.replicas[0] == 0 or result.scale_events[0][1] == 0
    assert result.timeline.replicas[-1] == 0  # back to zero after the cooldown


def test_timeouts_and_full_queues_are_errors(profile):
    trace = [TraceRequest(0.0, 1000, 2000) for _ in range(40)]
    result = run(profile, trace, service(), request_timeout=2, max_waiting_requests=10)
    reasons = {r.error for r in result.requests}
    assert "503: the pod's queue is full" in reasons and "timed out before its first token" in reasons
    assert result.summary.errors == sum(r.error is not None for r in result.requests) > 0


def _picker():
    from argosy.operator.spec import RoutingSpec

    return RoutingSpec.model_validate({"endpointPicker": {"name": "picker"}})


def objectives_service(**objectives):
    return service(
        minReplicas=1,
        maxReplicas=12,
        objectives={
            "timeToFirstTokenSeconds": 2,
            "interTokenLatencySeconds": 0.05,
            "promptTokens": 400,
            "outputTokens": 100,
            "profileConfigMap": "profile",
            **objectives,
        },
    )


@settings(max_examples=4, deadline=None, derandomize=True)
@given(rate=st.floats(0.5, 12))
def test_objectives_never_reverse_within_the_window_under_constant_load(profile, rate):
    """Evenly spaced arrivals: the fleet may grow and then settle, but never turns around within the
    scale-down stabilisation window (a down soon after an up, or an up soon after a down)."""
    trace = [TraceRequest(i / rate, 400, 100) for i in range(int(600 * rate))]
    result = run(profile, trace, objectives_service(), pod_start_seconds=60)
    events = result.scale_events
    reversals = [
        (a, b) for a, b in itertools.pairwise(events) if (a[2] - a[1]) * (b[2] - b[1]) < 0 and b[0] - a[0] < 300
    ]
    assert reversals == []
    assert max(result.timeline.replicas) <= 12


def test_a_fleet_can_start_as_it_stood_before_the_trace(profile):
    # Three pods already serving at the start: the first requests meet no pod start, and with no load the
    # HPA takes the fleet back to minReplicas.
    trace = [TraceRequest(0.0, 100, 2) for _ in range(3)]
    spec = service(minReplicas=1, maxReplicas=4, scaleDownStabilizationSeconds=60)
    result = run(profile, trace, spec, initial_replicas=3, until=400, router="round_robin")
    assert result.timeline.replicas[0] == 3 and result.timeline.starting[0] == 0
    assert max(r.ttft for r in result.requests) < 0.2
    assert result.timeline.replicas[-1] == 1
    # Never above maxReplicas, whatever it is asked.
    assert run(profile, trace, spec, initial_replicas=9).summary.max_replicas == 4


def test_the_lower_bound_runs_each_minutes_replicas_for_that_minute():
    from argosy.simulator.lower_bound import lower_bound_replica_seconds, replicas_needed

    # 100 tokens/s a replica: 30 requests of 1000 tokens in the first minute need 5, none in the second 1.
    trace = [TraceRequest(i, 10, 1000) for i in range(30)] + [TraceRequest(119.0, 10, 10)]
    assert replicas_needed(trace, 100.0, min_replicas=1) == [5, 1]
    assert lower_bound_replica_seconds(trace, 100.0, min_replicas=1) == (5 + 1) * 60
    assert lower_bound_replica_seconds(trace, 100.0, min_replicas=2) == (5 + 2) * 60


def test_a_warm_pool_serves_a_burst_in_the_wake_time(profile):
    trace = generate("poisson:rate=12,duration=120,prompt=400,output=50,seed=5")
    spec = service(minReplicas=1, maxReplicas=3, targetWaitingRequests=2, scaleDownStabilizationSeconds=60)
    cold = run(profile, trace, spec, pod_start_seconds=600, until=700)
    warm = run(profile, trace, spec, pod_start_seconds=600, until=700, warm_pool=2, wake_seconds=1.0)
    # Cold, the new pods arrive after the burst; warm, the asleep pods serve within a sync and the wake.
    assert max(cold.timeline.ready[: 150 // 5]) == 1
    assert max(warm.timeline.ready[: 40 // 5]) == 3
    assert warm.summary.ttft_p99 < cold.summary.ttft_p99 / 2
    # The pool is refilled (new pods start), and asleep pods are paid for.
    assert max(warm.timeline.starting) == 2
    assert warm.timeline.asleep[0] == 2
    assert warm.summary.replica_seconds > cold.summary.replica_seconds
    # Scaled back down, drained pods go back to sleep while the pool has room.
    assert warm.timeline.replicas[-1] == 1 and warm.timeline.asleep[-1] == 2


def test_replicas_sharing_a_core_share_it_while_both_step(profile):
    alone = profile.step_seconds(StepShape(1, 100, 100 * 101 / 2 / 1000, 0, 0, 1))
    two = service().model_copy(update={"replicas": 2})
    at_once = [TraceRequest(0.0, 100, 1), TraceRequest(0.0, 100, 1)]
    together = run(profile, at_once, two, host_cores=1)
    # Both steps run at half speed from the start.
    assert [r.ttft for r in together.requests] == pytest.approx([2 * alone, 2 * alone])
    staggered = run(profile, [TraceRequest(0.0, 100, 1), TraceRequest(alone / 2, 100, 1)], two, host_cores=1)
    # The first runs alone for half its work, then both at half speed until it is done (at 1.5x);
    # the second, half done by then, finishes alone (at 2x, 1.5x after its arrival).
    assert [r.ttft for r in staggered.requests] == pytest.approx([1.5 * alone, 1.5 * alone])
    separate = run(profile, at_once, two)
    assert [r.ttft for r in separate.requests] == pytest.approx([alone, alone])
    # Two cores for two replicas: no slowdown.
    assert [r.ttft for r in run(profile, at_once, two, host_cores=2).requests] == pytest.approx([alone, alone])


def test_flow_control_holds_requests_while_every_replica_is_saturated(profile):
    # One replica, prompts far beyond what it admits at once: beyond 5 waiting, the gateway holds the rest.
    trace = [TraceRequest(0.0, 2000, 5) for _ in range(30)]
    result = run(profile, trace, service(), router="flow_control")
    assert max(result.timeline.waiting) > 5  # the pod's 5 and the held ones
    assert all(r.done and r.error is None for r in result.requests)
    held_first = sorted(result.requests, key=lambda r: r.first_token)
    assert [r.request_id for r in held_first] == [r.request_id for r in result.requests]  # in order
