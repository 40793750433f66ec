"""Typed results of a finished run: what the controller records and the report renders.

Produced by `rankpack.controller` from backend observations, stored by `rankpack.store`,
printed by `rankpack.report`. Keys of `to_json` are part of the CLI's machine-readable
output (`rankpack run --json`, `rankpack runs show --json`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rankpack.core.actions import RankWait

ResizeOutcome = Literal["pending", "completed", "deferred", "infeasible", "rejected", "failed"]
"""How a resize ended (``pending``: still in flight when the run ended)."""

RunStatus = Literal["running", "completed", "failed", "interrupted", "requeued"]

CONVERGED = "converged at iteration"
"""How a completed run's message starts when the solver stopped before endTime because its
residuals met the case's residualControl (pitzDaily does at ~285 iterations)."""


def progress_text(iterations: int, expected: int | None, *, converged: bool = False) -> str:
    """Progress as listings print it: ``285/1500``, ``285/1500 converged``, or ``285``."""
    if not expected:
        return str(iterations)
    return f"{iterations}/{expected}" + (" converged" if converged else "")


class RunProgress:
    """How far a run got, for a finished run's every form (`RunResult`, the store's
    `RunRow`): both carry these fields."""

    status: str
    message: str | None
    iterations: int
    expected_iterations: int | None

    @property
    def converged(self) -> bool:
        """Completed early because the solver converged (not because it reached endTime)."""
        return self.status == "completed" and (self.message or "").startswith(CONVERGED)

    @property
    def progress(self) -> str:
        return progress_text(self.iterations, self.expected_iterations, converged=self.converged)


@dataclass(frozen=True)
class ResizeRecord:
    """One in-place resize of one rank, from the request to its outcome."""

    rank: int
    t_s: float
    """Seconds since the run started when the resize was asked for."""
    from_millis: int
    to_millis: int
    status: ResizeOutcome
    latency_s: float | None
    """From the request to the backend's confirmation (cgroup written, pod status allocated)."""
    reason: str = ""
    """Why the controller resized (or, for a refused resize, why it was refused)."""
    kind: str = "size"
    """size | fairness | phase: which part of the policy asked for it."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WaitRecord:
    """A wait mode the simulation's ranks got (at launch, then each live switch)."""

    t_s: float
    """The controller's clock (seconds since its start)."""
    mode: str
    reason: str
    ranks: tuple[RankWait, ...] = ()
    """Per rank: its node and why (the ranks and cores there)."""


@dataclass(frozen=True)
class RankResult:
    rank: int
    weight: float
    cpu_millis: int
    """The request in force at the end of the run."""
    limit_millis: int | None
    cpu_s: float
    """Integrated from samples (trapezoidal rule)."""
    cpu_s_counter: float
    """From the rank pod's cumulative usage counter."""
    nr_throttled: int
    throttled_s: float
    cells: int | None = None
    duty: float | None = None
    """Fraction of time computing rather than inside MPI (PMPI shim), if measured."""
    pod: str | None = None
    """Where the rank ran: its pod (Kubernetes) or cgroup (local)."""
    node: str | None = None
    restarts: int = 0


@dataclass(frozen=True)
class RunResult(RunProgress):
    id: int
    status: str
    """completed | failed | interrupted"""
    case: str
    solver: str
    run_dir: str
    n_ranks: int
    qos: str
    total_millis: int
    iterations: int
    expected_iterations: int | None
    wall_s: float
    cpu_s: float
    exit_code: int | None
    message: str | None
    ranks: tuple[RankResult, ...]
    failure: str | None = None
    """A failed run's code (`rankpack.core.failures.FailureCode`), None otherwise."""
    decompose: str = "equal"
    backend: str = "local"
    placement: dict[str, Any] = field(default_factory=dict)
    """Backend-specific facts of where it ran (local: the cgroup version; Kubernetes: the
    namespace and nodes)."""
    resizes: tuple[ResizeRecord, ...] = ()
    restarts: int = 0
    wait_modes: tuple[WaitRecord, ...] = ()
    """How its ranks waited in MPI: the launch mode, then each live switch, with reasons."""
    shared_s: float | None = None
    """Seconds of its run during which another simulation of the same controller ran too
    (to the controller's tick; 0: it had the node to itself; None: unknown, for example a
    run adopted from an earlier controller). Measurements of a run that shared the node
    are not what it does alone: `rankpack.controller.learned` does not learn from them."""

    def to_json(self, *, with_ranks: bool = True) -> dict[str, Any]:
        data = asdict(self)
        if not with_ranks:
            data.pop("ranks")
        return data
