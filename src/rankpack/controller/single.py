"""Prepare one OpenFOAM run and drive it to the end on a backend.

`prepare` validates everything it can before creating anything, then builds the run
directory in a staging folder (copy, mesh, decompose) and renames it into place; a failure
removes the staging folder, so bad input leaves nothing behind. `execute` launches the
ranks, samples their CPU about once a second, follows the solver log, and on the way out
(normal end, solver failure, Ctrl-C, SIGTERM) stops every rank, removes the run's cgroups
and records the result. The run directory and logs always stay.
"""

from __future__ import annotations

import re
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from rankpack.backend.protocol import Backend, RankResources, SimObservation, SimSpec
from rankpack.case import openfoam
from rankpack.case.foamlog import LogFollower, LogState
from rankpack.errors import UserError
from rankpack.plan.allocation import Plan, QoS
from rankpack.report.results import RankResult, RunResult, trapezoid_cpu_s
from rankpack.store import Store

LIMITS_HAZARD = (
    "hard CPU limits (--qos limits) throttle ranks at MPI barriers and can multiply wall "
    "time by orders of magnitude (1900x measured here on pitzDaily); use the default "
    "--qos requests, or add --allow-limits if you really want quotas"
)


@dataclass(frozen=True)
class RunOptions:
    case: str
    plan: Plan
    iterations: int | None = None
    decompose: str = "equal"
    decompose_weights: list[float] | None = None
    """Weights for the decomposition (default: the plan's weights)."""
    center: tuple[float, float, float] | None = None
    workdir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for every rank (e.g. the PMPI shim)."""
    label: str | None = None


@dataclass(frozen=True)
class PreparedRun:
    options: RunOptions
    source: openfoam.CaseSource
    run_dir: Path
    solver: str
    cells_per_rank: list[int]
    expected_iterations: int

    @property
    def log_path(self) -> Path:
        return self.run_dir / f"log.{self.solver}"


def check_options(options: RunOptions, allow_limits: bool) -> None:
    """Validation that needs no files: done before anything is created."""
    if options.plan.qos is QoS.LIMITS and not allow_limits:
        raise UserError(LIMITS_HAZARD)
    if options.iterations is not None and options.iterations < 1:
        raise UserError(f"--iterations must be at least 1, got {options.iterations}")
    if options.decompose not in ("equal", "weighted", "concentric"):
        raise UserError(
            f"unknown decomposition '{options.decompose}'; use equal, weighted or concentric"
        )


def _new_run_dir(runs_root: Path, name: str, n_ranks: int) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    base = runs_root / f"{stamp}-{safe}-{n_ranks}r"
    candidate, i = base, 1
    while candidate.exists():
        i += 1
        candidate = base.with_name(f"{base.name}-{i}")
    return candidate


def prepare(options: RunOptions, runs_root: Path) -> PreparedRun:
    n_ranks = options.plan.n_ranks
    source = openfoam.resolve_case(options.case)
    if openfoam.has_mesh(source.path):
        _check_cells(openfoam.n_cells(source.path), n_ranks, source.name)
    if options.workdir is not None:
        final = options.workdir.expanduser().resolve()
        if final.exists() and any(final.iterdir()):
            raise UserError(f"--workdir {final} exists and is not empty; give a new directory")
    else:
        final = _new_run_dir(runs_root, source.name, n_ranks)
    staging = final.parent / f".staging-{uuid.uuid4().hex[:8]}-{final.name}"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        openfoam.copy_case(source, staging)
        solver = openfoam.read_application(staging)
        openfoam.ensure_mesh(staging)
        _check_cells(openfoam.n_cells(staging), n_ranks, source.name)
        if options.iterations is not None:
            tc = openfoam.set_iterations(staging, options.iterations)
        else:
            tc = openfoam.read_time_control(staging)
        cells = _decompose(staging, options)
        if final.exists():
            final.rmdir()
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return PreparedRun(
        options=options,
        source=source,
        run_dir=final,
        solver=solver,
        cells_per_rank=cells,
        expected_iterations=tc.steps,
    )


def _check_cells(cells: int, n_ranks: int, name: str) -> None:
    if n_ranks > cells:
        raise UserError(f"{n_ranks} ranks but {name} has only {cells} cells; use fewer ranks")


def _decompose(case_dir: Path, options: RunOptions) -> list[int]:
    n = options.plan.n_ranks
    if options.decompose == "equal":
        openfoam.write_decompose_dict(case_dir, n)
        return openfoam.decompose(case_dir)
    from rankpack.case.decomposition import decompose_case

    weights = options.decompose_weights or [r.weight for r in options.plan.ranks]
    result = decompose_case(case_dir, n, options.decompose, weights, options.center)
    if result.openfoam_cells is None:
        raise UserError(f"decomposePar did not run for {case_dir}")
    for warning in result.warnings:
        print(f"rankpack: warning: {warning}", file=sys.stderr)
    return list(result.openfoam_cells)


# -- execution ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """What the display and the controller see once a second."""

    elapsed_s: float
    observation: SimObservation
    log: LogState
    expected_iterations: int
    cpu_cores: tuple[float, ...]
    """Per-rank CPU use over the last sample interval, in cores."""
    duty: tuple[float | None, ...] = ()


class Display(Protocol):
    def update(self, tick: Tick) -> None: ...
    def close(self) -> None: ...


class NullDisplay:
    def update(self, tick: Tick) -> None:
        pass

    def close(self) -> None:
        pass


class DutySource(Protocol):
    """Per-rank duty cycles of the running simulation (the PMPI shim's records)."""

    def live(self) -> tuple[float | None, ...]: ...
    def counters(self) -> tuple[tuple[int, int] | None, ...]: ...
    def steady(self) -> tuple[float | None, ...]: ...
    def close(self) -> None: ...


class ActiveRun:
    """One launched simulation: its database record, samples, log and final result.

    `execute` drives one of these to the end; the multiplexing controller drives several
    at once through the same methods.
    """

    def __init__(
        self,
        backend: Backend,
        store: Store,
        prepared: PreparedRun,
        *,
        cgroups: str,
        duty_source: Callable[[Path], DutySource] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.backend = backend
        self.store = store
        self.prepared = prepared
        plan = prepared.options.plan
        self.run_id = store.create_run(
            {
                "case_name": prepared.source.name,
                "case_source": str(prepared.source.path),
                "run_dir": str(prepared.run_dir),
                "solver": prepared.solver,
                "n_ranks": plan.n_ranks,
                "qos": plan.qos.value,
                "total_millis": plan.total_millis,
                "decompose": prepared.options.decompose,
                "cgroups": cgroups,
                "expected_iterations": prepared.expected_iterations,
                "options_json": {
                    "iterations": prepared.options.iterations,
                    "label": prepared.options.label,
                    "env": sorted(prepared.options.env),
                    "weights": [r.weight for r in plan.ranks],
                    **(extra or {}),
                },
            }
        )
        store.set_plan(
            self.run_id,
            [
                (r.rank, r.weight, r.cpu_millis, r.limit_millis, prepared.cells_per_rank[r.rank])
                for r in plan.ranks
            ],
        )
        self.cgroups = cgroups
        self.sim_id = f"r{self.run_id}"
        self.spec = SimSpec(
            sim_id=self.sim_id,
            case_dir=prepared.run_dir,
            command=(prepared.solver, "-parallel"),
            ranks=tuple(RankResources(r.cpu_millis, r.limit_millis) for r in plan.ranks),
            log_path=prepared.log_path,
            env={**openfoam_rank_env(), **prepared.options.env},
        )
        self.follower = LogFollower(prepared.log_path)
        self._duty_factory = duty_source
        self._duty: DutySource | None = None
        self.handle: Any = None
        self.t0 = 0.0
        self.end_t: float | None = None
        self.last: SimObservation | None = None
        self.times: list[float] = []
        self.usages: list[list[int]] = [[] for _ in plan.ranks]
        self._pending: list[tuple[float, int, int, int, int, int | None]] = []
        self.result: RunResult | None = None

    @property
    def duty_source(self) -> DutySource | None:
        """The shim reader of this run (after `start`), or None without the shim."""
        return self._duty

    @property
    def running(self) -> bool:
        return self.handle is not None and self.result is None and self.end_t is None

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.handle = self.backend.launch(self.spec)
        if self._duty_factory is not None:
            self._duty = self._duty_factory(self.prepared.run_dir)

    def sample(self) -> Tick:
        """Read counters and the log once; record the sample. Marks the end if the job ended."""
        obs = self.backend.observe(self.handle)
        state = self.follower.poll()
        cores = _record(obs, self.t0, self.times, self.usages, self._pending, state.iterations)
        if len(self._pending) >= 8 * len(self.usages):
            self.store.add_samples(self.run_id, self._pending)
            self._pending = []
        self.last = obs
        if obs.exit_code is not None and self.end_t is None:
            self.end_t = time.monotonic()
        return Tick(
            elapsed_s=obs.t_s - self.t0,
            observation=obs,
            log=state,
            expected_iterations=self.prepared.expected_iterations,
            cpu_cores=cores,
            duty=self._duty.live() if self._duty else (),
        )

    def resize(self, rank: int, resources: RankResources) -> None:
        self.backend.resize(self.handle, rank, resources)

    def finish(self, interrupted: str | None = None) -> RunResult:
        """Stop (if still running), take the final reading, clean up, record the result."""
        if self.result is not None:
            return self.result
        status = "failed"
        message: str | None = None
        try:
            if self.handle is not None:
                if interrupted is not None and self.end_t is None:
                    self.backend.stop(self.handle)
                    status, message = "interrupted", interrupted
                if self.end_t is None:
                    self.end_t = time.monotonic()
                # Final counters: the cgroups still exist, so this reading is complete.
                self.last = self.backend.observe(self.handle)
                _record(
                    self.last, self.t0, self.times, self.usages, self._pending,
                    self.follower.poll().iterations,
                )  # fmt: skip
                self.store.add_samples(self.run_id, self._pending)
                self._pending = []
        finally:
            if self.handle is not None:
                self.backend.release(self.handle)
        if interrupted is not None and status != "interrupted":
            status, message = "interrupted", interrupted
        self.result = self._result(status, message)
        self.store.finish_run(self.result)
        return self.result

    def _result(self, status: str, message: str | None) -> RunResult:
        prepared, last = self.prepared, self.last
        plan = prepared.options.plan
        state = self.follower.finish()
        wall_s = ((self.end_t or time.monotonic()) - self.t0) if self.handle is not None else 0.0
        exit_code = last.exit_code if last else None
        if status != "interrupted":
            if exit_code == 0 and state.ended:
                status = "completed"
            else:
                status = "failed"
                message = state.fatal or (
                    f"the MPI job exited with code {exit_code}; see {prepared.log_path}"
                )
        duty = self._duty.steady() if self._duty else ()
        if self._duty is not None:
            self._duty.close()
        ranks = []
        for r in plan.ranks:
            obs_rank = last.ranks[r.rank] if last else None
            ranks.append(
                RankResult(
                    rank=r.rank,
                    weight=r.weight,
                    cpu_millis=obs_rank.request_millis if obs_rank else r.cpu_millis,
                    limit_millis=obs_rank.limit_millis if obs_rank else r.limit_millis,
                    cpu_s=trapezoid_cpu_s(self.times, self.usages[r.rank]),
                    cpu_s_counter=(obs_rank.usage_ns / 1e9) if obs_rank else 0.0,
                    nr_throttled=obs_rank.nr_throttled if obs_rank else 0,
                    throttled_s=(obs_rank.throttled_ns / 1e9) if obs_rank else 0.0,
                    cells=prepared.cells_per_rank[r.rank],
                    duty=duty[r.rank] if r.rank < len(duty) else None,
                )
            )
        return RunResult(
            id=self.run_id,
            status=status,
            case=prepared.source.name,
            solver=prepared.solver,
            run_dir=str(prepared.run_dir),
            n_ranks=plan.n_ranks,
            qos=plan.qos.value,
            total_millis=plan.total_millis,
            iterations=state.iterations,
            expected_iterations=prepared.expected_iterations,
            wall_s=wall_s,
            cpu_s=sum(r.cpu_s for r in ranks),
            exit_code=exit_code,
            cgroups=self.cgroups,
            message=message,
            ranks=tuple(ranks),
            decompose=prepared.options.decompose,
        )


def execute(
    backend: Backend,
    store: Store,
    prepared: PreparedRun,
    *,
    cgroups: str,
    display: Display | None = None,
    stop: threading.Event | None = None,
    sample_interval_s: float = 1.0,
    duty_source: Callable[[Path], DutySource] | None = None,
    on_tick: Callable[[Tick, Any], None] | None = None,
    extra: dict[str, Any] | None = None,
) -> RunResult:
    """Run one prepared simulation to its end (or until ``stop`` is set) and record it.

    ``extra`` is stored with the run's options (e.g. the wait mode it ran with)."""
    display = display or NullDisplay()
    stop = stop or threading.Event()
    run = ActiveRun(backend, store, prepared, cgroups=cgroups, duty_source=duty_source, extra=extra)
    interrupted: str | None = None
    try:
        run.start()
        while True:
            tick = run.sample()
            display.update(tick)
            if on_tick is not None:
                on_tick(tick, run.handle)
            if tick.observation.exit_code is not None:
                break
            if _wait_or_stop(backend, run.handle, stop, sample_interval_s):
                interrupted = "stopped by the user (Ctrl-C or SIGTERM)"
                break
    except KeyboardInterrupt:
        interrupted = "stopped by the user (Ctrl-C)"
    finally:
        try:
            result = run.finish(interrupted)
        finally:
            display.close()
    return result


def attach_shim(
    prepared: PreparedRun, wait_mode: str
) -> tuple[PreparedRun, Callable[[Path], DutySource]]:
    """Load the PMPI shim into every rank: live records go to ``<run>/.rankpack/shim``."""
    from dataclasses import replace

    from rankpack.profile.shim import shim_env
    from rankpack.profile.tracker import DutyTracker

    live_dir = prepared.run_dir / ".rankpack" / "shim"
    live_dir.mkdir(parents=True, exist_ok=True)
    env = {**prepared.options.env, **shim_env(live_dir, wait_mode)}
    prepared = replace(prepared, options=replace(prepared.options, env=env))
    n = prepared.options.plan.n_ranks
    return prepared, lambda run_dir: DutyTracker(live_dir, n)


def _wait_or_stop(backend: Backend, handle: Any, stop: threading.Event, interval_s: float) -> bool:
    """Wait one sample interval for the job to end; True if a stop was requested."""
    deadline = time.monotonic() + interval_s
    while True:
        if stop.is_set():
            return True
        left = deadline - time.monotonic()
        if left <= 0 or backend.wait(handle, min(0.05, left)) is not None:
            return False


def openfoam_rank_env() -> dict[str, str]:
    """OpenFOAM's variables every rank needs (Debian layout), forwarded by mpirun."""
    env = openfoam.foam_env()
    return {k: v for k, v in env.items() if k in ("WM_PROJECT_DIR", "LD_LIBRARY_PATH")}


def _record(
    obs: SimObservation,
    t0: float,
    times: list[float],
    usages: list[list[int]],
    pending: list[tuple[float, int, int, int, int, int | None]],
    iterations: int,
) -> tuple[float, ...]:
    t = obs.t_s - t0
    cores: list[float] = []
    for r in obs.ranks:
        series = usages[r.rank]
        if series and times:
            dt = t - times[-1]
            cores.append((r.usage_ns - series[-1]) / 1e9 / dt if dt > 0 else 0.0)
        else:
            cores.append(0.0)
        series.append(r.usage_ns)
        pending.append((t, r.rank, r.usage_ns, r.request_millis, r.nr_throttled, iterations))
    times.append(t)
    return tuple(cores)
