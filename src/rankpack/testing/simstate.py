"""The simulated cluster's records: one simulation (`SimRun`), one rank (`SimRank`), a resize
in flight (`SimInFlight`), and the checks a stage request must pass (`stage_error`).

Plain mutable data; `rankpack.testing.simcluster` moves them through time, and
`rankpack.testing.simresizes` and `rankpack.testing.simnodes` read and change them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rankpack.backend.protocol import (
    RankPhase,
    RankResources,
    ResizeState,
    ResizeStatus,
    SimPhase,
    SimSpec,
    StagedCase,
    StageSpec,
)
from rankpack.case.staging import DECOMPOSITIONS
from rankpack.core.failures import FailureCode
from rankpack.testing.simmodel import SimulatedCase


@dataclass
class SimInFlight:
    """A resize that has not settled yet."""

    status: ResizeStatus
    """As requested (PENDING); the states after it are derived from this one."""
    target: RankResources
    outcome: ResizeState
    """COMPLETED, or INFEASIBLE / FAILED when scripted."""
    reason: str = ""
    deferred_until: float | None = None
    """None: accepted; a time: deferred by a script until then; inf: until it fits."""
    in_progress_at: float | None = None
    settle_at: float | None = None
    sim_id: str = ""
    """Whose rank it resizes."""
    arrives_s: float = 0.0
    """When the request reaches the node (after the apiserver's delay, `simapi`)."""


@dataclass
class SimRank:
    index: int
    node: str
    desired: RankResources
    allocated: RankResources
    phase: RankPhase = RankPhase.PENDING
    usage_s: float = 0.0
    compute_s: float = 0.0
    mpi_s: float = 0.0
    restarts: int = 0
    reason: str = ""
    resize: ResizeStatus | None = None
    in_flight: SimInFlight | None = None
    charged: int = 0
    """Millicores counted as requested on its node now (`simnodes.SimNodeLoad.recharge`)."""


@dataclass
class SimRun:
    """One simulation of the cluster, from its stage request to its release."""

    sim_id: str
    stage_spec: StageSpec
    phase: SimPhase
    ready_at: float
    case: SimulatedCase | None = None
    staged: StagedCase | None = None
    stage_error: str | None = None
    spec: SimSpec | None = None
    ranks: list[SimRank] = field(default_factory=list)
    work_s: tuple[float, ...] = ()
    running_at: float = math.inf
    started_s: float | None = None
    done: int = 0
    frac: float = 0.0
    """Fraction of the current iteration already computed."""
    wait_mode: str = "spin"
    exit_code: int | None = None
    reason: str = ""
    failure: FailureCode | None = None
    """Why it failed, as a code (with ``reason`` as the message)."""
    log: list[str] = field(default_factory=list)
    synced_s: float = 0.0
    """Cluster time up to which its counters and iterations are integrated (they are
    brought up to date lazily: when observed, and before anything changes its speeds)."""

    @property
    def active(self) -> bool:
        return self.phase in (SimPhase.PENDING, SimPhase.RUNNING)

    @property
    def total(self) -> int:
        """Iterations the run will do: the expected ones, or fewer if the case converges."""
        if self.staged is None:
            return 0
        converges = self.case.converges_at if self.case else None
        return min(self.staged.expected_iterations, converges or self.staged.expected_iterations)

    @property
    def converged(self) -> bool:
        return self.staged is not None and self.total < self.staged.expected_iterations

    def fail(self, code: FailureCode, reason: str) -> None:
        """Mark it FAILED (before any rank ran: staging, or stopped before launch)."""
        self.phase, self.reason, self.failure = SimPhase.FAILED, reason, code


ABSENT = SimRun("", StageSpec("", "", 1, Path()), SimPhase.FAILED, 0.0)
"""Stands for a simulation that is not there (its ``active`` is False)."""


def stage_error(
    spec: StageSpec, case: SimulatedCase | None, known: list[str]
) -> tuple[FailureCode, str] | None:
    """Why ``spec`` cannot be staged with ``case`` (None: unknown), or None if it can."""
    if case is None:
        known_cases = ", ".join(known)
        message = f"unknown case '{spec.case}'; the simulated cluster knows {known_cases}"
        return FailureCode.NOT_A_CASE, message
    error = _spec_error(spec, case)
    return (FailureCode.INVALID_SPEC, error) if error is not None else None


def _spec_error(spec: StageSpec, case: SimulatedCase) -> str | None:
    if spec.n_ranks < 1:
        return f"a simulation needs at least one rank, got {spec.n_ranks}"
    if spec.iterations is not None and spec.iterations < 1:
        return f"the iteration count must be at least 1, got {spec.iterations}"
    if spec.decompose not in DECOMPOSITIONS:
        return f"unknown decomposition '{spec.decompose}'; use one of {', '.join(DECOMPOSITIONS)}"
    if spec.n_ranks > case.cells:
        return f"{spec.n_ranks} ranks but {case.name} has only {case.cells} cells"
    weights = spec.decompose_weights
    if spec.decompose != "equal" and weights:
        if len(weights) != spec.n_ranks:
            return f"{len(weights)} decomposition weights for {spec.n_ranks} ranks"
        if min(weights) <= 0:
            return "decomposition weights must be positive"
    return None
