"""Simulation: one service's fleet under a trace. Requests arrive at their trace times and go
through the router to a ready replica (or are held while none is); each replica is an EngineCore
on the profile's clock; Prometheus scrapes the pods; KEDA polls its triggers and the HPA it made
syncs, both from the operator's own ScaledObject for the service; the Deployment starts and
drains pods. A request with no first token within the client's timeout is given up (an error),
as is one a full queue refuses."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from argosy.operator.objectives import thresholds_for
from argosy.operator.owner import Owner
from argosy.operator.scaledobject import build_scaled_object
from argosy.operator.spec import InferenceServiceSpec
from argosy.server.profile.engine_profile import EngineProfile
from argosy.simulator.deployment import Deployment
from argosy.simulator.host import SharedHost
from argosy.simulator.keda import ScaledObjectController
from argosy.simulator.prometheus import Prometheus
from argosy.simulator.replica import Replica
from argosy.simulator.requests import SimRequest
from argosy.simulator.router import Router, RouterPolicy
from argosy.simulator.summary import Objectives, Summary, summarise
from argosy.simulator.timeline import Timeline, record
from argosy.simulator.trace import TraceRequest

OWNER = Owner(name="simulated", namespace="simulated", uid="simulated")
HPA_SYNC_SECONDS = 15  # --horizontal-pod-autoscaler-sync-period
RETRY_SECONDS = 0.1  # how often the router offers what it holds again


@dataclass
class SimulationConfig:
    profile: EngineProfile
    trace: list[TraceRequest]
    service: InferenceServiceSpec  # its autoscaling (or replicas) and engine.shutdownTimeoutSeconds
    objectives: Objectives
    router: RouterPolicy = "round_robin"
    pod_start_seconds: float = 100.0  # from a pod's creation to its server answering /health
    scrape_seconds: float = 15.0
    request_timeout: float = 600.0  # a client gives up on a request with no first token by then
    max_waiting_requests: int = 1024  # a pod's queue; beyond it, 503
    sample_seconds: float = 5.0
    until: float = 0.0  # run at least this long, past the trace's end (to watch the fleet scale down)
    warm_pool: int = 0  # pods kept asleep beyond the replicas asked for
    wake_seconds: float = 1.0  # from asleep (sleep mode level 1) to serving
    host_cores: int | None = None  # the replicas share this many cores (a loopback fleet); None: a device each
    initial_replicas: int | None = None  # serving when the trace starts; None: minReplicas (at least 1)


@dataclass
class SimulationResult:
    summary: Summary
    timeline: Timeline
    requests: list[SimRequest] = field(repr=False)
    scale_events: list[tuple[float, int, int]] = field(repr=False)


class Simulation:
    def __init__(self, config: SimulationConfig):
        self.config = config
        self.env = simpy.Environment()
        service = config.service
        self.keda = None
        if (autoscaling := service.autoscaling) is not None:
            objectives = autoscaling.objectives
            thresholds = None if objectives is None else thresholds_for(config.profile, objectives)
            self.keda = ScaledObjectController(build_scaled_object(OWNER, service, thresholds))
        initial = service.replicas if self.keda is None else max(self.keda.min_replicas, 1)
        if config.initial_replicas is not None and self.keda is not None:
            initial = min(max(config.initial_replicas, initial), self.keda.max_replicas)
            self.keda.hpa.settled_at(0.0, initial)  # no scale-down on the empty first scrapes
        drain = service.engine.shutdownTimeoutSeconds
        host = None if config.host_cores is None else SharedHost(self.env, config.host_cores)
        self.deployment = Deployment(
            self.env,
            lambda name, started: Replica(
                self.env,
                name,
                config.profile,
                0.0 if started else config.pod_start_seconds,
                drain,
                config.max_waiting_requests,
                host,
            ),
            initial,
            config.warm_pool,
            config.wake_seconds,
        )
        self.held: deque[SimRequest] = deque()
        self.prometheus = Prometheus(self.env, self.deployment, lambda: len(self.held), config.scrape_seconds)
        self.router = Router(config.router)
        self.requests: list[SimRequest] = []
        self._open: list[SimRequest] = []  # arrived and not done, as of the last look
        self.timeline = Timeline()

    def run(self, progress: Callable[[float], None] = lambda _: None) -> SimulationResult:
        env, config = self.env, self.config
        end_of_trace = config.trace[-1].time if config.trace else 0.0
        env.process(self._arrivals())
        env.process(self._dispatch_held())
        env.process(self._give_up())
        env.process(
            record(env, self.timeline, self.deployment, lambda: len(self.held), self.requests, config.sample_seconds)
        )
        if self.keda is not None:
            env.process(self._keda())
            env.process(self._hpa())
        horizon = max(end_of_trace + config.request_timeout + 60, config.until)
        while env.peek() < horizon and not (env.now >= max(end_of_trace, config.until) and self._all_done()):
            env.step()
            progress(env.now)
        duration = env.now
        summary = summarise(
            self.requests,
            config.objectives,
            self.deployment.replica_seconds(duration),
            len(self.deployment.scale_events),
            max([self.deployment.replicas, *(to for _, _, to in self.deployment.scale_events)]),
            duration,
        )
        return SimulationResult(summary, self.timeline, self.requests, self.deployment.scale_events)

    def _all_done(self) -> bool:
        """Checked after every event past the trace's end: only the requests still open are looked at."""
        self._open = [r for r in self._open if not r.done]
        return len(self.requests) == len(self.config.trace) and not self._open

    def _arrivals(self):
        for i, trace in enumerate(self.config.trace):
            yield self.env.timeout(max(0.0, trace.time - self.env.now))
            request = SimRequest(f"r{i}", trace, self.env.now)
            self.requests.append(request)
            self._open.append(request)
            if self.held or not self._route(request):  # behind the ones held already
                self.held.append(request)

    def _route(self, request: SimRequest) -> bool:
        """False when no replica is ready (the request stays held)."""
        replica = self.router.pick(self.deployment.ready_pods())
        if replica is None:
            return False
        if not replica.submit(request):
            request.error = "503: the pod's queue is full"
        return True

    def _dispatch_held(self):
        while True:
            yield self.env.timeout(RETRY_SECONDS)
            while self.held and self._route(self.held[0]):
                self.held.popleft()

    def _give_up(self):
        """Each second: requests without a first token past the client's timeout are abandoned."""
        timeout = self.config.request_timeout
        while True:
            yield self.env.timeout(1.0)
            late = self.env.now - timeout
            for pod in self.deployment.pods:
                for request in [r for r in pod.requests.values() if r.first_token is None and r.arrival < late]:
                    pod.abort(request, "timed out before its first token")
            while self.held and self.held[0].arrival < late:
                self.held.popleft().error = "timed out held by the router"

    def _keda(self):
        while True:
            replicas = self.keda.poll(self.env.now, self.deployment.replicas, self.prometheus.query)
            if replicas != self.deployment.replicas:
                self.deployment.scale(replicas)
            yield self.env.timeout(self.keda.polling_seconds)

    def _hpa(self):
        while True:
            yield self.env.timeout(HPA_SYNC_SECONDS)
            replicas = self.keda.sync_hpa(self.env.now, self.deployment.replicas, self.prometheus.query)
            if replicas != self.deployment.replicas:
                self.deployment.scale(replicas)
