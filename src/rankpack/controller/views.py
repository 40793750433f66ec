"""What the control loop shows: a view of each simulation every tick, and its result.

`SimView` (with a `RankView` per rank) is handed to the `Display` once per tick: the live
terminal tables of `rankpack run` and `multiplex`, the operator's Simulation status and
metrics. `LoopResult` is what `ControlLoop.run` returns when the queue ran out or it was
stopped: every run's `RunResult`, a `SimOutcome` row per simulation for session summaries,
and the jobs that failed before they had a run (`StageFailure`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rankpack.case.foamlog import LogState
from rankpack.core.failures import FailureCode
from rankpack.core.results import RunResult, WaitRecord


@dataclass(frozen=True)
class RankView:
    rank: int
    request_millis: int
    limit_millis: int | None
    cpu_cores: float
    """CPU use over the last tick, in cores."""
    nr_throttled: int
    duty: float | None
    allocated_millis: int | None = None
    """The request the node has applied (None: not known)."""
    restarts: int = 0
    resize: str | None = None
    """State of a resize not settled yet (pending, in-progress, deferred), else None."""
    resize_to_millis: int | None = None
    resize_reason: str = ""
    node: str | None = None
    """The node it runs on (None: not bound to one yet)."""


@dataclass(frozen=True)
class SimView:
    """What a display shows of one simulation each tick."""

    sim_id: str
    run_id: int | None
    run_dir: str | None
    case: str
    stage: str
    elapsed_s: float
    log: LogState
    expected_iterations: int
    ranks: tuple[RankView, ...]
    queue_id: int = 0
    resizes: int = 0
    """Resizes completed so far."""
    wait: WaitRecord | None = None
    """The wait mode its ranks have now and why (None: not launched yet)."""
    running: bool = False
    """Every rank of its launch runs (the backend's last observation says so; false while
    its pods are created, scheduled and started)."""


class Display(Protocol):
    def update(self, now_s: float, sims: Sequence[SimView]) -> None: ...
    def close(self) -> None: ...


class NullDisplay:
    def update(self, now_s: float, sims: Sequence[SimView]) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class SimOutcome:
    """A simulation's row in a session's summary; times ``*_s`` on the loop's clock
    (seconds since the session started) but ``wall_s`` and ``cpu_s``."""

    id: int
    queue_id: int
    case: str
    n_ranks: int
    status: str
    iterations: int
    expected_iterations: int
    wall_s: float
    started_s: float
    """Its launch."""
    finished_s: float
    run_dir: str
    cpu_s: float = 0.0
    """CPU-seconds of all its ranks."""
    start: str = ""
    """How it started (`rankpack.controller.learned.start_of`): learned, profiled, plan."""
    staging_from_s: float | None = None
    """When its case began staging (at its claim, or ahead of it); None: not known."""
    staged_s: float | None = None
    """When its case was staged (seen so by the loop)."""
    waits: tuple[tuple[float, str], ...] = ()
    """(time, mode) of its ranks' wait mode at launch and at each live switch."""
    wait_s: dict[str, float] = field(default_factory=dict)
    """Seconds its ranks spent in each wait mode, launch to end."""


@dataclass(frozen=True)
class StageFailure:
    """A job that failed before it had a run (its case could not be staged)."""

    queue_id: int
    case: str
    reason: str
    failure: FailureCode = FailureCode.STAGE_FAILED


@dataclass(frozen=True)
class LoopResult:
    status: str
    """completed (the queue ran out) | interrupted"""
    results: tuple[RunResult, ...]
    outcomes: tuple[SimOutcome, ...]
    stage_failures: tuple[StageFailure, ...]
    resizes: int
    resizes_rejected: int
    restarts: int
    max_concurrent_seen: int
