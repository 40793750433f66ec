"""The simulated backend's world: its settings and the pure formulas of its model.

`rankpack.testing.simcluster` keeps the state (virtual clock, simulations, resizes) and
calls these functions; they have no state, no clock and no randomness, so the model can be
tested (and read) on its own. The formulas are documented in the `simulated` module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rankpack.backend.protocol import ResizeState
from rankpack.core.actions import WAIT_MODES as WAIT_MODES  # adaptive is modelled as polite


@dataclass(frozen=True)
class SimNode:
    """One simulated node."""

    name: str
    allocatable_millis: int
    """CPU the node offers to rank pods, millicores (4000: 4 cores)."""
    reserved_millis: int = 0
    """Requests of other tenants on the node, millicores. They count as requested in the
    inventory and compete for the CPU like one busy pod that uses at most its request."""


@dataclass(frozen=True)
class SimulatedCase:
    """A case the simulated backend can stage, named like a tutorial."""

    name: str
    cells: int
    iterations: int
    """Time steps of a run when the StageSpec gives none."""
    cell_work_s: float = 2e-5
    """CPU seconds one cell costs per iteration on one full core."""
    mpi_s_per_iteration: float = 0.0
    """Communication time every rank spends inside MPI per iteration, seconds, on top of
    waiting for the slowest rank (latency of the halo exchange and reductions)."""
    solver: str = "simpleFoam"
    mpi: str | None = None
    """The MPI its solver links as staging finds it (`StagedCase.mpi`; None: not told)."""
    converges_at: int | None = None
    """The iteration at which the solver's residuals meet the case's residualControl: a run
    with more iterations stops there, its log saying so as simpleFoam does (None: never)."""


DEFAULT_CASES = (
    SimulatedCase("pitzDaily", cells=12225, iterations=300, cell_work_s=2e-5),
    SimulatedCase("cavity", cells=400, iterations=100, cell_work_s=2e-5),
)
"""Cases every `SimulatedCluster` knows unless it is given others."""


@dataclass(frozen=True)
class SimTiming:
    """How long the simulated cluster takes for things, virtual seconds."""

    stage_s: float = 1.0
    """Copy, mesh and decompose a case."""
    start_s: float = 1.0
    """From launch to every rank running (scheduling, image pull, container start)."""
    resize_latency_s: float = 1.0
    """From a resize request to the new CPU being in force (0: at once, like a cgroup
    write; the request is then COMPLETED in the status `resize` returns)."""


@dataclass(frozen=True)
class RankFault:
    """A rank that fails at a given virtual time (see `SimulatedCluster.add_fault`)."""

    sim_id: str
    rank: int
    at_s: float
    """Cluster clock, virtual seconds. A fault due before the launch fires at the launch."""
    reason: str = "killed by signal 9"
    restart: bool = False
    """False: the rank dies and takes the simulation down (phase FAILED, reason
    ``rank N failed: <reason>``). True: the rank's container is restarted in place and
    MPI survives it: its restart count goes up and the current iteration starts over."""


@dataclass(frozen=True)
class ResizeScript:
    """Forces the outcome of the next matching resize (see `SimulatedCluster.script_resize`)."""

    state: ResizeState
    """DEFERRED, INFEASIBLE, REJECTED or FAILED."""
    sim_id: str | None = None
    """Only resizes of this simulation (None: any)."""
    rank: int | None = None
    """Only resizes of this rank (None: any)."""
    reason: str = ""
    defer_s: float = 5.0
    """DEFERRED: how long the resize stays deferred before the cluster tries it again."""
    count: int = 1
    """How many matching resizes it applies to."""


def cpu_speeds(
    capacity_cores: float, weights: Sequence[float], caps: Sequence[float]
) -> list[float]:
    """CPU speed (cores) of each busy task on one node: weighted max-min fair sharing.

    speed_i = min(cap_i, lam * w_i), with lam the largest value such that the speeds add up
    to at most ``capacity_cores`` (water-filling: what CFS gives busy tasks with weights
    ``w_i``). When no task reaches its cap, speed_i = capacity * w_i / sum(w).
    """
    speeds = [0.0] * len(weights)
    active = [i for i in range(len(weights)) if weights[i] > 0 and caps[i] > 0]
    left = float(capacity_cores)
    while active and left > 1e-12:
        total_w = sum(weights[i] for i in active)
        lam = left / total_w
        capped = [i for i in active if lam * weights[i] >= caps[i] - 1e-12]
        if not capped:
            for i in active:
                speeds[i] = lam * weights[i]
            break
        for i in capped:
            speeds[i] = caps[i]
            left -= caps[i]
        active = [i for i in active if i not in capped]
    return speeds


def split_cells(cells: int, weights: Sequence[float]) -> tuple[int, ...]:
    """``cells`` split in proportion to ``weights`` (largest remainder; exact sum; ties to
    the lower rank), like a weighted decomposition."""
    total = float(sum(weights))
    exact = [cells * w / total for w in weights]
    out = [math.floor(x) for x in exact]
    left = cells - sum(out)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[:left]:
        out[i] += 1
    return tuple(out)


@dataclass(frozen=True)
class IterationTiming:
    """The pace of one simulation while its ranks' speeds stay the same."""

    iteration_s: float
    """Wall time of one iteration: max_i(work_i / speed_i) + mpi_s_per_iteration."""
    duty: tuple[float, ...]
    """Per rank, the fraction of wall time spent computing: (work_i / speed_i) / iteration_s."""


def iteration_timing(
    work_s: Sequence[float], speeds: Sequence[float], mpi_s_per_iteration: float
) -> IterationTiming:
    compute = [w / s if s > 0 else math.inf for w, s in zip(work_s, speeds, strict=True)]
    iteration_s = max(compute) + mpi_s_per_iteration
    if not math.isfinite(iteration_s) or iteration_s <= 0:
        return IterationTiming(iteration_s=math.inf, duty=tuple(0.0 for _ in compute))
    return IterationTiming(
        iteration_s=iteration_s, duty=tuple(min(1.0, c / iteration_s) for c in compute)
    )


def usage_rate(speed: float, duty: float, wait_mode: str) -> float:
    """CPU cores a rank burns: all of its speed when it spins inside MPI, only while it
    computes when it waits politely (adaptive counts as polite)."""
    return speed if wait_mode == "spin" else speed * duty


def log_header(case: str, solver: str, n_ranks: int) -> str:
    return (
        f"/* simulated {solver} */\nExec   : {solver} -parallel\nCase   : {case}\n"
        f"nProcs : {n_ranks}\n\nStarting time loop\n\n"
    )


def log_iteration(iteration: int, execution_s: float, clock_s: float) -> str:
    """One steady-solver time step as OpenFOAM prints it (what `LogParser` reads)."""
    residual = 1.0 / (1.0 + 0.05 * iteration)
    return (
        f"Time = {iteration}\n\n"
        f"smoothSolver:  Solving for Ux, Initial residual = {residual:.6g}, "
        f"Final residual = {residual * 0.01:.6g}, No Iterations 2\n"
        f"ExecutionTime = {execution_s:.2f} s  ClockTime = {math.floor(clock_s + 1e-9)} s\n\n"
    )


def log_end(converged_at: int | None = None) -> str:
    if converged_at is not None:
        return f"\nSIMPLE solution converged in {converged_at} iterations\n\nEnd\n\n"
    return "End\n\n"


def log_rank_failure(rank: int, node: str, reason: str) -> str:
    return (
        f"--------------------------------------------------------------------------\n"
        f"mpirun noticed that process rank {rank} with PID 0 on node {node} exited on "
        f"signal 9 ({reason}).\n"
    )
