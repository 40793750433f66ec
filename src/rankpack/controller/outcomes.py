"""A simulation's run as recorded: its run row at launch, its result at its end.

`new_run` writes the run row (and a row per rank) when a simulation is launched or adopted:
the one place a run's options and placement are put together. `run_result` assembles the
`RunResult` when it ends: status and message, the failure's code (`rankpack.core.failures`),
per-rank CPU seconds, duty cycles, resizes and wait modes. A rank's CPU seconds and duty
come from what the loop observed live (usage samples, duty marks); a rank it never saw live
(a run adopted after it ended) gets them from the final record its shim wrote
(`RankObservation.final`). `outcome` is its row in a session's summary. Called by the
control loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankpack.backend.protocol import SimPhase, StagedCase
from rankpack.controller.effects import seconds_by_mode
from rankpack.controller.tracked import LoopContext, Tracked
from rankpack.controller.views import SimOutcome
from rankpack.core.accounting import trapezoid_cpu_s_ranks
from rankpack.core.failures import Failure, FailureCode
from rankpack.core.results import CONVERGED, RankResult, RunResult
from rankpack.store import NewRun, RankRow


@dataclass(frozen=True)
class Ending:
    """Why the loop ends a simulation, when it is not because the simulation ended."""

    stopped: str | None = None
    """Stopped by the loop (its message): the run is ``interrupted``."""
    failure: Failure | None = None
    """The loop saw it fail (it could not be launched): the run is ``failed``."""


def new_run(ctx: LoopContext, sim: Tracked, staged: StagedCase) -> int:
    """Record the run of ``sim`` (launched or adopted now); its run id."""
    sub, s = sim.job.submission, ctx.settings
    options = {
        **sub.to_json(),
        "label": s.label,
        "shim": s.shim,
        "wait_mode": sim.wait_setting,
        "sim_id": sim.sim_id,
        "queue_id": sim.job.queue_id,
        "start": sim.start,
        **({"learned_from": sim.learned_from} if sim.learned_from is not None else {}),
        **s.extra,
        **sim.resumed,  # (a run resumed after a lost node: from where, iterations lost)
    }
    return ctx.store.create_run(
        NewRun(
            case_name=staged.case_name,
            case_source=staged.case_source,
            run_dir=str(staged.run_dir),
            solver=staged.solver,
            n_ranks=sub.n_ranks,
            qos=sim.plan.qos.value,
            total_millis=sim.plan.total_millis,
            decompose=sub.decompose,
            backend=ctx.backend.name,
            placement=ctx.backend.placement(),
            expected_iterations=staged.expected_iterations,
            options=options,
        ),
        [
            RankRow(r.rank, r.weight, r.cpu_millis, r.limit_millis, staged.cells_per_rank[r.rank])
            for r in sim.plan.ranks
        ],
    )


def _status(sim: Tracked, ending: Ending) -> tuple[str, str | None, FailureCode | None]:
    """(status, message, failure code) of a run that ends."""
    assert sim.staged is not None
    last, state = sim.last, sim.parser.state
    if ending.stopped is not None:
        return "interrupted", ending.stopped, FailureCode.STOPPED
    if ending.failure is not None:
        return "failed", ending.failure.message, ending.failure.code
    if last is not None and last.phase is SimPhase.SUCCEEDED and state.ended:
        return "completed", f"{CONVERGED} {state.iterations}" if state.converged else None, None
    exit_code = last.exit_code if last else None
    why = last.reason if last and last.reason else f"exit code {exit_code}"
    if state.fatal and state.fatal not in why:
        why = f"{why} ({state.fatal})"
    # the backend's code, set where it saw the failure (the log's fatal line is text: it
    # may be the solver's error or mpirun's note of a killed rank, so it gives no code)
    code = last.failure if last is not None and last.failure is not None else FailureCode.OTHER
    return "failed", f"{why}; see {sim.staged.log_path}", code


def run_result(ctx: LoopContext, sim: Tracked, ending: Ending) -> RunResult:
    assert sim.staged is not None and sim.run_id is not None
    staged, last, plan = sim.staged, sim.last, sim.plan
    state = sim.parser.state
    wall_s = (sim.end_t if sim.end_t is not None else ctx.backend.clock()) - sim.t0
    status, message, failure = _status(sim, ending)
    ranks = []
    series = [sim.usages[r.rank] if r.rank < len(sim.usages) else [] for r in plan.ranks]
    cpu_s = trapezoid_cpu_s_ranks(sim.times, series) if sim.usages else [0.0] * len(series)
    for r, integrated in zip(plan.ranks, cpu_s, strict=True):
        o = last.ranks[r.rank] if last and r.rank < len(last.ranks) else None
        # what the rank's shim wrote when it ended, for what was not seen live: no duty
        # marks (a run adopted after its end), and CPU the samples missed (adopted mid-run
        # or after its end: what ran before the first sample, or the flat counters of pods
        # that had ended). Its own process's CPU (no MPI daemon, no rank launcher) is at
        # most what its pod's cgroup counted, so the larger of the two is the better.
        final = o.final if o else None
        duty = steady_duty(sim.duty_marks.get(r.rank, []), staged.expected_iterations)
        ranks.append(
            RankResult(
                rank=r.rank,
                weight=r.weight,
                cpu_millis=o.request_millis if o else r.cpu_millis,
                limit_millis=o.limit_millis if o else r.limit_millis,
                cpu_s=integrated if final is None else max(integrated, final.cpu_s),
                cpu_s_counter=(o.usage_ns / 1e9) if o else 0.0,
                nr_throttled=o.nr_throttled if o else 0,
                throttled_s=(o.throttled_ns / 1e9) if o else 0.0,
                cells=staged.cells_per_rank[r.rank],
                duty=duty if duty is not None or final is None else final.duty,
                pod=o.pod if o else None,
                node=o.node if o else None,
                restarts=o.restarts if o else 0,
            )
        )
    return RunResult(
        id=sim.run_id,
        status=status,
        case=staged.case_name,
        solver=staged.solver,
        run_dir=str(staged.run_dir),
        n_ranks=plan.n_ranks,
        qos=plan.qos.value,
        total_millis=plan.total_millis,
        iterations=state.iterations,
        expected_iterations=staged.expected_iterations,
        wall_s=max(0.0, wall_s),
        cpu_s=sum(r.cpu_s for r in ranks),
        exit_code=last.exit_code if last else None,
        message=message,
        ranks=tuple(ranks),
        failure=failure.value if failure is not None else None,
        decompose=sim.job.submission.decompose,
        backend=ctx.backend.name,
        placement=ctx.backend.placement(),
        resizes=tuple(sim.resizes),
        restarts=sum(r.restarts for r in ranks),
        shared_s=None if sim.shared_s is None else round(sim.shared_s, 3),
        wait_modes=tuple(sim.waits),
    )


def outcome(result: RunResult, sim: Tracked, finished_s: float) -> SimOutcome:
    """The run's row in a session's summary."""
    waits = tuple((w.t_s, w.mode) for w in sim.waits)
    return SimOutcome(
        id=result.id,
        queue_id=sim.job.queue_id,
        case=result.case,
        n_ranks=result.n_ranks,
        status=result.status,
        iterations=result.iterations,
        expected_iterations=result.expected_iterations or 0,
        wall_s=result.wall_s,
        started_s=sim.started_s,
        finished_s=finished_s,
        run_dir=result.run_dir,
        cpu_s=round(result.cpu_s, 3),
        start=sim.start,
        staging_from_s=sim.staging_from_s,
        staged_s=sim.staged_at_s,
        waits=waits,
        wait_s=seconds_by_mode(waits, finished_s),
    )


def keep_mark(
    marks: list[tuple[int, int, int]],
    mark: tuple[int, int, int],
    expected: int,
    skip: float = 0.1,
) -> None:
    """Add an observation's (iterations, compute ns, MPI ns) to a rank's ``marks``, keeping
    only what `steady_duty` reads: the first mark, the first past ``skip`` of the run, and
    the last (a run of thousands of observations keeps three)."""
    if len(marks) < 2:
        marks.append(mark)
        return
    threshold = skip * expected
    last = len(marks) - 1
    anchored = 0  # the first mark before the last that is past skip (last: none is)
    while anchored < last and marks[anchored][0] < threshold:
        anchored += 1
    if anchored == last and marks[-1][0] >= threshold:
        marks.append(mark)  # the last one is the first past skip: keep it
        return
    marks[-1] = mark


def steady_duty(
    marks: list[tuple[int, int, int]], expected: int, skip: float = 0.1
) -> float | None:
    """Duty cycle over the run with its first ``skip`` fraction left out (start-up).

    ``marks`` are (iterations, cumulative compute ns, cumulative MPI ns) per observation.
    When no observation saw the rank between that point and its end (a short run, or a
    solver log that reached the controller only at the end), the window widens to the
    first observation and then to the whole run since MPI_Init: a duty with start-up in
    it, rather than none.
    """
    if not marks:
        return None
    end = marks[-1]
    start = next((m for m in marks if m[0] >= skip * expected), marks[0])
    for first in (start, marks[0], (0, 0, 0)):  # (0, 0, 0): MPI_Init
        compute, mpi = end[1] - first[1], end[2] - first[2]
        if compute + mpi > 0:
            return compute / (compute + mpi)
    return None
