"""A Simulation's progress in its status: `StatusWriter`, the operator's `Display`.

The control loop's view of each Simulation (iterations, per-rank CPU, resizes, wait modes)
is copied into its status at most every ``interval_s``; a resize the node deferred sets the
condition ``ResizeDeferred``, a grow held within the namespace's quota ``ResizeHeld``
(``QuotaExceeded``). Every write goes through the queue's status outbox
(`rankpack.operator.outbox.StatusOutbox.patch`), which coalesces them: at most one patch
per Simulation per its ``status_interval_s`` but for phase changes and launches (issue 29).
Extended by `rankpack.operator.display.OperatorDisplay` (metrics and Events too).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from rankpack.controller.views import SimView
from rankpack.core.failures import FailureCode
from rankpack.core.results import progress_text
from rankpack.operator import transitions
from rankpack.operator.queue import SimulationQueue
from rankpack.operator.transitions import condition
from rankpack.report.glance import eta_s, glance

Obj = dict[str, Any]

ETA_MARKS = 7
"""Progress marks (one per status write, ``interval_s`` apart) the ETA's rate is taken
over: about a minute at the operator's 10 s."""


class StatusWriter:
    """A `Display` that copies the loop's view of each Simulation into its status.

    A Simulation claimed is ``Starting``; the first view in which every rank of its launch
    runs makes it ``Running`` (written at once). Progress goes through the queue's outbox
    (`StatusOutbox.patch`: merged with what waits, written once due, kept while the
    apiserver does not answer). A rank whose resize the node deferred shows it
    (``ranks[].resize``) and sets the condition ``ResizeDeferred``; ``resizes`` counts
    completed resizes only.
    """

    def __init__(self, queue: SimulationQueue, interval_s: float = 2.0) -> None:
        self.queue = queue
        self.interval_s = interval_s
        self.last: dict[int, float] = {}
        self.deferred: dict[str, str] = {}
        """Simulation name -> the ResizeDeferred message last written (absent: none)."""
        self.quota_held: dict[str, str] = {}
        """Simulation name -> the ResizeHeld (QuotaExceeded) message last written."""
        self.listeners: list[Callable[[float, Sequence[SimView]], None]] = []
        self.running: set[str] = set()
        """The sim ids whose ``Running`` (every rank runs) was written."""
        self.marks: dict[int, deque[tuple[float, int]]] = {}
        """Queue id -> (wall time, iterations) at its last status writes (`ETA_MARKS`)."""
        self.wall: Callable[[], float] = time.time

    def update(self, now_s: float, sims: Sequence[SimView]) -> None:
        for listener in self.listeners:
            listener(now_s, sims)
        self.queue.flush()
        t = time.monotonic()
        self.running &= {v.sim_id for v in sims}
        for gone in set(self.marks) - {v.queue_id for v in sims}:  # ended: its rate with it
            del self.marks[gone]
        for view in sims:
            if view.running and view.sim_id not in self.running:
                self._ranks_run(view)
            if view.run_id is None or t - self.last.get(view.queue_id, -1e9) < self.interval_s:
                continue
            name = self.queue.index.key(view.queue_id)
            if name is None:
                continue
            self.last[view.queue_id] = t
            deferred = "; ".join(
                f"rank {r.rank} {r.request_millis}m -> {r.resize_to_millis}m: {r.resize_reason}"
                for r in view.ranks
                if r.resize == "deferred"
            )
            conditions = []
            if deferred != self.deferred.get(name, ""):
                conditions.append(
                    condition("ResizeDeferred", True, "NodeDeferred", deferred)
                    if deferred
                    else condition("ResizeDeferred", False, "Applied", "no resize deferred")
                )
            marks = self.marks.setdefault(view.queue_id, deque(maxlen=ETA_MARKS))
            marks.append((self.wall(), view.log.iterations))
            status = self._status(view)
            left = eta_s(marks, view.expected_iterations)
            if left is not None:
                status["eta"] = iso_time(marks[-1][0] + left)
            self.queue.outbox.patch(name, status, conditions)
            self.deferred[name] = deferred

    def _ranks_run(self, view: SimView) -> None:
        """``Starting`` -> ``Running``: every rank of its launch runs (a phase: written at
        once, `StatusOutbox.patch`)."""
        name = self.queue.index.key(view.queue_id)
        if name is None:
            return
        self.running.add(view.sim_id)
        change = transitions.running(view.sim_id)
        self.queue.outbox.patch(name, change.fields, change.conditions)

    def resize_held(self, name: str, message: str | None, reason: str = "") -> None:
        """A grow of Simulation ``name`` held within the namespace's quota (``message``:
        why) sets its condition ``ResizeHeld`` (reason ``QuotaExceeded``, or ``reason``:
        ``NodeFull``, its rank's node cannot hold it); a resize that completes afterwards
        (None) clears it. Written only when it changes."""
        held = self.quota_held.get(name)
        if message == held or (message is None and held is None):
            return
        if message is None:
            self.quota_held.pop(name, None)
            cond = condition("ResizeHeld", False, "Applied", "no grow is held")
        else:
            self.quota_held[name] = message
            cond = condition("ResizeHeld", True, reason or str(FailureCode.QUOTA_EXCEEDED), message)
        self.queue.outbox.patch(name, {}, [cond])

    @staticmethod
    def _status(view: SimView) -> Obj:
        exp = view.expected_iterations
        ranks = []
        for r in view.ranks:
            rank: Obj = {"rank": r.rank, "requestMillis": r.request_millis,
                         "cpuCores": round(r.cpu_cores, 3)}  # fmt: skip
            if r.node is not None:
                rank["node"] = r.node
            if r.allocated_millis is not None:
                rank["allocatedMillis"] = r.allocated_millis
            if r.duty is not None:
                rank["duty"] = round(r.duty, 4)
            # always written, so a settled resize clears it (merge patch replaces the list)
            rank["resize"] = (
                {"state": r.resize, "toMillis": r.resize_to_millis, "reason": r.resize_reason}
                if r.resize
                else None
            )
            ranks.append({k: v for k, v in rank.items() if v is not None})
        if view.wait is not None:
            for rank, why in zip(ranks, view.wait.ranks, strict=False):
                rank["wait"] = {"mode": why.mode, "node": why.node, "why": why.why}
        status: Obj = {
            "iterations": view.log.iterations,
            "progress": progress_text(view.log.iterations, exp),
            "resizes": view.resizes,
            "restarts": sum(r.restarts for r in view.ranks),
            "ranks": ranks,
        }
        if view.wait is not None:
            status["waitMode"] = {"mode": view.wait.mode, "reason": view.wait.reason}
        seen = glance(view)
        if seen.duty_mean is not None and seen.duty_min is not None:
            status["duty"] = {"mean": round(seen.duty_mean, 3), "min": round(seen.duty_min, 3)}
        if seen.efficiency is not None:
            status["efficiency"] = round(seen.efficiency, 3)
        if seen.nodes:
            status["nodes"] = ",".join(seen.nodes)
        if seen.residuals:
            status["residuals"] = {k: float(f"{v:.3g}") for k, v in seen.residuals.items()}
        return status

    def close(self) -> None:
        pass


def iso_time(unix_s: float) -> str:
    """``unix_s`` as the status writes times (UTC, whole seconds, ``Z``)."""
    return datetime.fromtimestamp(round(unix_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
