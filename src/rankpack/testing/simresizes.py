"""In-place resizes on the simulated cluster: requested, deferred, in progress, settled.

A resize is refused at once (REJECTED) if it can never be valid; otherwise it is in flight
(`simstate.SimInFlight`) until it settles ``timing.resize_latency_s`` later. A growth that does
not fit its node is DEFERRED until it does (oldest first, `SimResizes.retry_deferred`). A
`ResizeScript` forces the outcome of the next matching resizes (a test's way to see
DEFERRED, INFEASIBLE, REJECTED or FAILED). `rankpack.testing.simcluster` calls this room when
a resize is asked for and whenever its clock passes a resize's due time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from rankpack.backend.protocol import RankResources, ResizeState, ResizeStatus
from rankpack.testing.simmodel import ResizeScript, SimTiming
from rankpack.testing.simnodes import SimNodeLoad
from rankpack.testing.simstate import SimInFlight, SimRank, SimRun

SCRIPTABLE = (ResizeState.DEFERRED, ResizeState.INFEASIBLE, ResizeState.REJECTED,
              ResizeState.FAILED)  # fmt: skip


@dataclass
class _Script:
    script: ResizeScript
    left: int


class SimResizes:
    """The resize rules of one cluster (its nodes' load, timing, scripts and clock)."""

    def __init__(
        self,
        load: SimNodeLoad,
        sims: Mapping[str, SimRun],
        timing: SimTiming,
        clock: Callable[[], float],
        before_settle: Callable[[SimRank], None] = lambda r: None,
    ) -> None:
        self._load = load
        self._sims = sims
        self._timing = timing
        self._clock = clock
        self._before_settle = before_settle
        """Called before a rank's allocation changes (the cluster brings the speeds it
        alters up to date first)."""
        self._scripts: list[_Script] = []
        self.flying: dict[tuple[str, int], SimRank] = {}
        """The ranks with a resize in flight (what `due_times` and `retry_deferred` look at)."""

    def script(self, script: ResizeScript) -> None:
        if script.state not in SCRIPTABLE:
            raise ValueError(f"a resize cannot be scripted to be {script.state}")
        self._scripts.append(_Script(script, script.count))

    def request(
        self, sim: SimRun, r: SimRank, resources: RankResources, arrives_s: float | None = None
    ) -> ResizeStatus:
        """Ask for ``r``'s new CPU; the state known at once (as `Backend.resize`).
        ``arrives_s``: when the request reaches the node (the apiserver's delay; default
        now)."""
        now = self._clock()
        status = ResizeStatus(
            ResizeState.PENDING,
            from_millis=r.allocated.request_millis,
            to_millis=resources.request_millis,
            requested_t_s=now,
        )
        script = self._take_script(sim.sim_id, r.index)
        reject = self._rejection(sim, r, resources)
        if reject is None and script is not None and script.state is ResizeState.REJECTED:
            reject = script.reason or "rejected (scripted)"
        if reject is not None:
            r.resize = replace(status, state=ResizeState.REJECTED, latency_s=0.0, reason=reject)
            return r.resize
        r.desired = resources
        flight = SimInFlight(status, resources, ResizeState.COMPLETED, sim_id=sim.sim_id,
                          arrives_s=max(now, now if arrives_s is None else arrives_s))  # fmt: skip
        r.in_flight = flight
        self.flying[(sim.sim_id, r.index)] = r
        if script is not None and script.state is ResizeState.DEFERRED:
            flight.deferred_until = now + script.defer_s
            flight.reason = script.reason or "deferred (scripted)"
            r.resize = replace(status, state=ResizeState.DEFERRED, reason=flight.reason)
            self._load.recharge(r)
            return r.resize
        if script is not None:
            flight.outcome = script.state
            flight.reason = script.reason or f"{script.state} (scripted)"
        r.resize = status
        self._accept(r, fresh=True)
        if r.in_flight is None or flight.target.request_millis < status.from_millis:
            self.retry_deferred()
        assert r.resize is not None
        return r.resize

    def due_times(self, r: SimRank) -> list[float]:
        """When ``r``'s resize in flight changes state next (empty: none in flight)."""
        f = r.in_flight
        if f is None:
            return []
        return [t for t in (f.deferred_until, f.in_progress_at, f.settle_at) if t is not None]

    def process_due(self, r: SimRank, due: float) -> bool:
        """Carry out ``r``'s resize steps due by ``due``; True if it settled."""
        f = r.in_flight
        if f is None:
            return False
        if f.deferred_until is not None and f.deferred_until <= due:
            self._accept(r, fresh=False)
        if f.in_progress_at is not None and f.in_progress_at <= due:
            f.in_progress_at = None
            r.resize = replace(f.status, state=ResizeState.IN_PROGRESS)
        if f.settle_at is not None and f.settle_at <= due:
            self._settle(r)
        return r.in_flight is None

    def abandon(self, r: SimRank) -> None:
        """``r``'s simulation ended: its resize in flight FAILED."""
        if r.in_flight is not None:
            r.resize = replace(
                r.in_flight.status,
                state=ResizeState.FAILED,
                latency_s=self._clock() - r.in_flight.status.requested_t_s,
                reason="simulation ended",
            )
            self.flying.pop((r.in_flight.sim_id, r.index), None)
            r.in_flight = None
            self._load.recharge(r)

    def retry_deferred(self) -> bool:
        """Accept resizes deferred for lack of room that now fit (oldest first)."""
        waiting = sorted(
            (r.in_flight.status.requested_t_s, sim_id, r.index)
            for (sim_id, _), r in self.flying.items()
            if r.in_flight is not None
            and r.in_flight.deferred_until == math.inf
            and self._sims[sim_id].active
        )
        news = False
        for _, sim_id, index in waiting:
            r = self._sims[sim_id].ranks[index]
            assert r.in_flight is not None
            if self._load.fits(r, r.in_flight.target):
                self._accept(r, fresh=False)
                news = news or r.in_flight is None
        return news

    def _rejection(self, sim: SimRun, r: SimRank, res: RankResources) -> str | None:
        node = self._load.node(r.node)
        if sim.phase.ended:
            return f"simulation {sim.sim_id} has ended"
        if res.request_millis < 1:
            return f"a request must be at least 1m, got {res.request_millis}m"
        if res.limit_millis is not None and res.limit_millis < res.request_millis:
            return f"limit {res.limit_millis}m is below request {res.request_millis}m"
        if res.request_millis > node.allocatable_millis:
            return (
                f"request {res.request_millis}m exceeds the allocatable CPU of node "
                f"{node.name} ({node.allocatable_millis}m)"
            )
        return None

    def _take_script(self, sim_id: str, rank: int) -> ResizeScript | None:
        for entry in self._scripts:
            script = entry.script
            if script.sim_id in (None, sim_id) and script.rank in (None, rank):
                entry.left -= 1
                if entry.left <= 0:
                    self._scripts.remove(entry)
                return script
        return None

    def _accept(self, r: SimRank, *, fresh: bool) -> None:
        """Start applying ``r``'s resize, or defer it until the node has room."""
        f = r.in_flight
        assert f is not None
        grows = f.target.request_millis > r.allocated.request_millis
        if f.outcome is ResizeState.COMPLETED and grows and not self._load.fits(r, f.target):
            node = self._load.node(r.node)
            free = max(0, node.allocatable_millis - self._load.requested(node.name))
            f.deferred_until = math.inf
            f.reason = f"node {node.name} has {free}m free"
            r.resize = replace(f.status, state=ResizeState.DEFERRED, reason=f.reason)
            self._load.recharge(r)
            return
        f.deferred_until = None
        start = max(self._clock(), f.arrives_s)
        latency = self._timing.resize_latency_s + (start - self._clock())
        if latency <= 0:
            self._settle(r)
            return
        self._load.recharge(r)
        f.settle_at = self._clock() + latency
        if fresh:
            f.in_progress_at = start + self._timing.resize_latency_s / 2
            r.resize = f.status
        else:
            r.resize = replace(f.status, state=ResizeState.IN_PROGRESS)

    def _settle(self, r: SimRank) -> None:
        f = r.in_flight
        assert f is not None
        changed = f.outcome is ResizeState.COMPLETED and f.target != r.allocated
        if changed:
            self._before_settle(r)
        r.in_flight = None
        self.flying.pop((f.sim_id, r.index), None)
        latency = self._clock() - f.status.requested_t_s
        if f.outcome is ResizeState.COMPLETED:
            r.allocated = f.target
            r.resize = replace(f.status, state=ResizeState.COMPLETED, latency_s=latency)
        else:
            r.resize = replace(f.status, state=f.outcome, latency_s=latency, reason=f.reason)
        self._load.recharge(r, allocated_changed=changed)
