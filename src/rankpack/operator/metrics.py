"""The operator's Prometheus endpoint (the ``prometheus-client`` package).

Gauges are set from the control loop's view every tick; counters from its recorded events;
``rankpack_apiserver_requests_total`` (by verb, resource and code) from the client's own
request counter (`kubeapi.RequestCounter`), read when scraped: divide its rate by
``rankpack_simulations_running`` for the requests per running simulation (issue 29).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from rankpack.backend.kubernetes.api.kubeapi import RequestCounter
from rankpack.controller.views import SimView
from rankpack.store import EventRow


class ApiRequests(Collector):
    """The operator's requests to the apiserver, as counted by its client."""

    def __init__(self, counter: RequestCounter) -> None:
        self.counter = counter

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "rankpack_apiserver_requests",
            "requests this operator sent to the apiserver (a watch counts once, when opened)",
            labels=["verb", "resource", "code"],
        )
        for (verb, resource, code), n in sorted(self.counter.counts().items()):
            family.add_metric([verb, resource, str(code)], n)
        yield family


RESIZE_OUTCOMES = {"resize": "completed", "resize-rejected": "rejected",
                   "resize-infeasible": "infeasible", "resize-failed": "failed",
                   "resize-deferred": "deferred", "resize-retry": "retried",
                   "resize-given-up": "given-up"}  # fmt: skip
"""Event kind -> outcome label. ``deferred`` counts deferrals as the node reports them (a
deferred resize that completes later also counts as ``completed``); ``retried`` counts
requests sent again after a failure."""


class OperatorMetrics:
    def __init__(self, requests: RequestCounter | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        if requests is not None:
            r.register(ApiRequests(requests))
        self.progress = Gauge(
            "rankpack_simulation_progress_ratio",
            "iterations done / iterations expected",
            ["simulation"],
            registry=r,
        )
        self.iterations = Gauge(
            "rankpack_simulation_iterations", "iterations done", ["simulation"], registry=r
        )
        self.request = Gauge(
            "rankpack_rank_request_millicores",
            "CPU request of a rank pod",
            ["simulation", "rank"],
            registry=r,
        )
        self.allocated = Gauge(
            "rankpack_rank_allocated_millicores",
            "CPU request the node has applied",
            ["simulation", "rank"],
            registry=r,
        )
        self.duty = Gauge(
            "rankpack_rank_duty_ratio",
            "compute / (compute + MPI wait) time",
            ["simulation", "rank"],
            registry=r,
        )
        self.running = Gauge("rankpack_simulations_running", "simulations running", registry=r)
        self.resizes = Counter("rankpack_resizes", "resizes by outcome", ["outcome"], registry=r)
        self.held = Counter(
            "rankpack_launches_held", "launches held back, by reason", ["reason"], registry=r
        )
        self.adopted = Counter(
            "rankpack_simulations_adopted",
            "simulations taken over from an earlier operator",
            registry=r,
        )
        self.finished = Counter(
            "rankpack_simulations_finished",
            "simulations that ended, by status and failure code ('' when none)",
            ["status", "code"],
            registry=r,
        )
        self.deferred = Gauge(
            "rankpack_rank_resize_deferred",
            "1 while a resize of the rank is deferred by its node",
            ["simulation", "rank"],
            registry=r,
        )
        self.resize_held = Gauge(
            "rankpack_simulation_resize_held",
            "1 while a grow of the simulation is held (quota, or its node is full)",
            ["simulation"],
            registry=r,
        )
        self.head_held = Gauge(
            "rankpack_launch_held",
            "1 while the head of the queue is held back for this reason",
            ["reason"],
            registry=r,
        )
        self.known: set[tuple[str, str]] = set()
        self.held_codes: set[str] = set()
        self.last_event = 0

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)

    def update(self, names: dict[int, str], sims: Sequence[SimView]) -> None:
        seen: set[tuple[str, str]] = set()
        self.running.set(sum(1 for s in sims if s.run_id is not None))
        for s in sims:
            name = names.get(s.queue_id, s.sim_id)
            if s.expected_iterations:
                self.progress.labels(name).set(s.log.iterations / s.expected_iterations)
            self.iterations.labels(name).set(s.log.iterations)
            for r in s.ranks:
                key = (name, str(r.rank))
                seen.add(key)
                self.request.labels(*key).set(r.request_millis)
                if r.allocated_millis is not None:
                    self.allocated.labels(*key).set(r.allocated_millis)
                if r.duty is not None:
                    self.duty.labels(*key).set(r.duty)
                self.deferred.labels(*key).set(1 if r.resize == "deferred" else 0)
        for key in self.known - seen:  # ended simulations: drop their per-rank series
            for g in (self.request, self.allocated, self.duty, self.deferred):
                with contextlib.suppress(KeyError):
                    g.remove(*key)
        self.known = seen

    def count_events(self, events: Sequence[EventRow]) -> None:
        for e in events:
            if e.id <= self.last_event:
                continue
            self.last_event = e.id
            if e.kind in RESIZE_OUTCOMES:
                if e.kind == "resize-deferred" and e.detail.get("final"):
                    continue  # still deferred at the end: counted when it was deferred
                self.resizes.labels(RESIZE_OUTCOMES[e.kind]).inc()
            elif e.kind == "launch-held":  # its code (quota, no-room, ...) when it has one
                code = str(e.detail.get("code") or "")
                code = code or _held_code(str(e.detail.get("reason", "")))
                self.held.labels(code).inc()
                self._head_held(code)
            elif e.kind in ("launch", "stage"):  # the head went ahead
                self._head_held(None)
            elif e.kind == "adopted":
                self.adopted.inc()
            elif e.kind == "finished":
                status = str(e.detail.get("status") or "")
                self.finished.labels(status, str(e.detail.get("code") or "")).inc()

    def _head_held(self, code: str | None) -> None:
        """The queue's head held for ``code`` (None: not held): that reason's series 1, the
        others 0."""
        if code is not None:
            self.held_codes.add(code)
        for c in self.held_codes:
            self.head_held.labels(c).set(1 if c == code else 0)

    def set_resize_held(self, simulation: str, held: bool) -> None:
        """A grow of ``simulation`` held (the status's ``ResizeHeld`` condition) or not."""
        self.resize_held.labels(simulation).set(1 if held else 0)


_HELD_CODES = (("more after", "cooldown"), ("needs", "no-room"), ("concurrent", "max-concurrent"),
               ("gain", "no-gain"), ("profil", "profiling"), ("warm", "profiling"))  # fmt: skip


def _held_code(reason: str) -> str:
    """The policy's reason text, as a short label value (bounded cardinality)."""
    low = reason.lower()
    return next((code for key, code in _HELD_CODES if key in low), "other")
