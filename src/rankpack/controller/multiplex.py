"""The multiplexing driver: runs the queue on a backend, several simulations at once.

Each tick (about once a second) it samples every running simulation (cgroup counters,
solver log, the PMPI shim's live records), builds `Observations`, calls the pure decision
step `policy.decide`, applies the returned actions through the backend (resize a rank in
place, launch the next queued simulation) and records every action with its reason as an
event. It never restarts a rank: restarts are *measured* (a rank whose pid changes) and
reported, and must stay 0.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankpack.backend.protocol import Backend, RankResources
from rankpack.controller.observations import (
    ControllerSettings,
    ControllerState,
    Launch,
    Note,
    Observations,
    Phase,
    QueuedSim,
    RankSnapshot,
    Resize,
    SimSnapshot,
)
from rankpack.controller.policy import decide
from rankpack.controller.single import ActiveRun, Tick, attach_shim, prepare
from rankpack.controller.submission import Submission
from rankpack.errors import UserError
from rankpack.store import Store


@dataclass(frozen=True)
class MultiplexOptions:
    capacity_millis: int
    wait_mode: str = "spin"
    sample_interval_s: float = 1.0
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    baseline: str = "auto"
    """auto | db | measure | none: where single-run times for the throughput gain come from."""


@dataclass
class Running:
    queue_id: int
    submission: Submission
    run: ActiveRun
    started_s: float
    last_tick: Tick | None = None
    pids: dict[int, str] = field(default_factory=dict)
    restarts: int = 0
    finished_s: float | None = None


@dataclass(frozen=True)
class SimOutcome:
    id: int
    queue_id: int
    case: str
    n_ranks: int
    status: str
    iterations: int
    expected_iterations: int
    wall_s: float
    started_s: float
    finished_s: float
    run_dir: str


@dataclass(frozen=True)
class MultiplexResult:
    multiplex_id: int
    status: str
    makespan_s: float
    sequential_s: float | None
    throughput_gain: float | None
    baseline_source: str
    fairness_ratio: float | None
    resizes: int
    restarts: int
    max_concurrent_seen: int
    simulations: tuple[SimOutcome, ...]
    resizes_rejected: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "multiplex_id": self.multiplex_id,
            "status": self.status,
            "makespan_s": self.makespan_s,
            "sequential_s": self.sequential_s,
            "throughput_gain": self.throughput_gain,
            "baseline": self.baseline_source,
            "fairness_ratio": self.fairness_ratio,
            "resizes": self.resizes,
            "resizes_rejected": self.resizes_rejected,
            "restarts": self.restarts,
            "max_concurrent_seen": self.max_concurrent_seen,
            "simulations": [s.__dict__ for s in self.simulations],
        }


class MultiplexDisplay:
    """What the driver shows each tick; a no-op by default."""

    def update(self, now_s: float, running: list[Running], state: ControllerState) -> None:
        pass

    def close(self) -> None:
        pass


class Multiplexer:
    def __init__(
        self,
        backend: Backend,
        store: Store,
        options: MultiplexOptions,
        *,
        runs_root: Path,
        cgroups: str,
        display: MultiplexDisplay | None = None,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.store = store
        self.options = options
        self.runs_root = runs_root
        self.cgroups = cgroups
        self.display = display or MultiplexDisplay()
        self.stop = stop or threading.Event()
        self.clock = clock
        self.t0 = clock()
        self.multiplex_id = store.start_multiplex(
            options.capacity_millis, options.controller.max_concurrent, options.wait_mode
        )
        self.state = ControllerState()
        self.running: dict[str, Running] = {}
        self.outcomes: list[SimOutcome] = []
        self.resizes = 0
        self.rejected = 0
        self.restarts = 0
        self.max_seen = 0

    # -- the loop --------------------------------------------------------------------------

    def now(self) -> float:
        return self.clock() - self.t0

    def event(self, run_id: int | None, name: str, **detail: Any) -> None:
        self.store.add_event(
            run_id, name, detail, multiplex_id=self.multiplex_id, t_s=round(self.now(), 3)
        )

    def run(self) -> MultiplexResult:
        status = "completed"
        self.event(None, "start", capacity_millis=self.options.capacity_millis,
                   max_concurrent=self.options.controller.max_concurrent,
                   wait_mode=self.options.wait_mode)  # fmt: skip
        try:
            while True:
                self._sample()
                queue = self.store.queue()
                if not queue and not self.running:
                    break
                obs = self._observations(queue)
                decision = decide(obs, self.state, self.options.controller)
                self.state = decision.state
                for action in decision.actions:
                    self._apply(action, queue)
                self.max_seen = max(self.max_seen, len(self.running))
                self.display.update(obs.now_s, list(self.running.values()), self.state)
                if self._wait_tick():
                    status = "interrupted"
                    break
        except KeyboardInterrupt:
            status = "interrupted"
        finally:
            for sim_id in list(self.running):
                self._finish(sim_id, interrupted="the multiplexer was stopped")
            self.display.close()
        return self._result(status)

    def _wait_tick(self) -> bool:
        """Wait one sample interval, waking early when a simulation ends (so its wall time
        and the makespan are exact to ~50 ms); True if a stop was requested."""
        deadline = self.clock() + self.options.sample_interval_s
        while not self.stop.is_set():
            left = deadline - self.clock()
            if left <= 0:
                return False
            slice_s = min(0.05, left) / max(1, len(self.running))
            for r in self.running.values():
                if self.backend.wait(r.run.handle, slice_s) is not None:
                    return False
            if not self.running:
                self.stop.wait(min(0.05, left))
        return True

    # -- observations ----------------------------------------------------------------------

    def _sample(self) -> None:
        for sim_id, r in list(self.running.items()):
            tick = r.run.sample()
            r.last_tick = tick
            self._check_restarts(r)
            if tick.observation.exit_code is not None:
                self._finish(sim_id)

    def _check_restarts(self, r: Running) -> None:
        pid_dir = r.run.prepared.run_dir / ".rankpack" / "pids"
        for pid_file in pid_dir.glob("rank-*.pid"):
            rank = int(pid_file.stem.split("-")[1])
            with contextlib.suppress(OSError):
                pid = pid_file.read_text().strip()
                if rank in r.pids and r.pids[rank] != pid:
                    r.restarts += 1
                    self.restarts += 1
                    self.event(r.run.run_id, "restart", rank=rank, old=r.pids[rank], new=pid)
                r.pids[rank] = pid

    def _observations(self, queue: list[dict[str, Any]]) -> Observations:
        sims = []
        for sim_id, r in self.running.items():
            tick = r.last_tick
            if tick is None:
                continue
            # the run's shim reader took this tick's snapshots in `sample`
            duty = r.run.duty_source
            counters = duty.counters() if duty is not None else ()
            ranks = tuple(
                RankSnapshot(
                    rank=o.rank,
                    request_millis=o.request_millis,
                    usage_ns=o.usage_ns,
                    compute_ns=c[0] if (c := _at(counters, o.rank)) else None,
                    mpi_ns=c[1] if c else None,
                )
                for o in tick.observation.ranks
            )
            sims.append(
                SimSnapshot(
                    sim_id=sim_id,
                    started_s=r.started_s,
                    iterations=tick.log.iterations,
                    expected_iterations=tick.expected_iterations,
                    budget_millis=r.submission.budget_millis,
                    ranks=ranks,
                    phases=r.submission.phases,
                )
            )
        queued = tuple(
            QueuedSim(
                queue_id=q["id"],
                n_ranks=q["n_ranks"],
                initial_request_millis=tuple(Submission.from_json(q["options"]).initial_millis),
            )
            for q in queue
        )
        return Observations(
            now_s=self.now(),
            capacity_millis=self.options.capacity_millis,
            sims=tuple(sims),
            queue=queued,
        )

    # -- actions ---------------------------------------------------------------------------

    def _apply(self, action: Resize | Launch | Note, queue: list[dict[str, Any]]) -> None:
        if isinstance(action, Resize):
            r = self.running.get(action.sim_id)
            if r is None:
                return
            try:
                r.run.resize(action.rank, RankResources(action.request_millis))
            except (OSError, UserError) as exc:
                # A rejected resize (cgroup write refused, API server says no) changes
                # nothing: the rank keeps running with its old request; record and go on.
                self.rejected += 1
                self.event(
                    r.run.run_id, "resize-rejected", rank=action.rank,
                    request_millis=action.request_millis, reason=str(exc),
                )  # fmt: skip
                return
            self.resizes += 1
            self.event(
                r.run.run_id, "resize", kind=action.kind, rank=action.rank,
                request_millis=action.request_millis, reason=action.reason,
            )  # fmt: skip
        elif isinstance(action, Launch):
            row = next((q for q in queue if q["id"] == action.queue_id), None)
            if row is not None:
                self._launch(row, action.reason)
        else:
            run_id = (
                self.running[action.sim_id].run.run_id if action.sim_id in self.running else None
            )
            self.event(run_id, action.kind, reason=action.reason)

    def _launch(self, row: dict[str, Any], reason: str) -> None:
        sub = Submission.from_json(row["options"])
        try:
            prepared_options = sub.run_options(label=f"multiplex-{self.multiplex_id}")
            prepared = prepare(prepared_options, self.runs_root)
        except UserError as exc:
            self.store.update_queue(row["id"], status="failed", multiplex_id=self.multiplex_id)
            self.event(None, "launch-failed", queue_id=row["id"], reason=str(exc))
            return
        prepared, duty_source = attach_shim(prepared, self.options.wait_mode)
        run = ActiveRun(
            self.backend, self.store, prepared, cgroups=self.cgroups, duty_source=duty_source,
            extra={"multiplex_id": self.multiplex_id, "queue_id": row["id"],
                   "wait_mode": self.options.wait_mode},
        )  # fmt: skip
        run.start()
        started = self.now()
        self.running[run.sim_id] = Running(row["id"], sub, run, started)
        self.store.update_queue(
            row["id"], status="running", run_id=run.run_id, multiplex_id=self.multiplex_id
        )
        self.event(
            run.run_id, "launch", queue_id=row["id"], case=sub.case, reason=reason,
            request_millis=list(sub.initial_millis),
        )  # fmt: skip

    def _finish(self, sim_id: str, interrupted: str | None = None) -> None:
        r = self.running.pop(sim_id)
        result = r.run.finish(interrupted)
        finished = self.now()
        self.store.update_queue(r.queue_id, status=result.status)
        self.event(
            result.id, "finished", status=result.status, iterations=result.iterations,
            wall_s=round(result.wall_s, 3),
        )  # fmt: skip
        self.outcomes.append(
            SimOutcome(
                id=result.id,
                queue_id=r.queue_id,
                case=result.case,
                n_ranks=result.n_ranks,
                status=result.status,
                iterations=result.iterations,
                expected_iterations=result.expected_iterations or 0,
                wall_s=result.wall_s,
                started_s=r.started_s,
                finished_s=finished,
                run_dir=result.run_dir,
            )
        )

    # -- the end ---------------------------------------------------------------------------

    def _result(self, status: str) -> MultiplexResult:
        sims = tuple(sorted(self.outcomes, key=lambda s: s.started_s))
        done = [s for s in sims if s.status == "completed"]
        makespan = (
            (max(s.finished_s for s in sims) - min(s.started_s for s in sims)) if sims else 0.0
        )
        walls = [s.wall_s for s in done]
        fairness = max(walls) / min(walls) if len(walls) >= 2 and min(walls) > 0 else None
        sequential, source = self._sequential_s(done) if status == "completed" else (None, "none")
        gain = sequential / makespan if sequential and makespan > 0 else None
        result = MultiplexResult(
            multiplex_id=self.multiplex_id,
            status=status,
            makespan_s=makespan,
            sequential_s=sequential,
            throughput_gain=gain,
            baseline_source=source,
            fairness_ratio=fairness,
            resizes=self.resizes,
            restarts=self.restarts,
            max_concurrent_seen=self.max_seen,
            resizes_rejected=self.rejected,
            simulations=sims,
        )
        self.store.finish_multiplex(self.multiplex_id, status, result.to_json())
        self.event(None, "end", status=status, makespan_s=round(makespan, 3))
        return result

    def _sequential_s(self, done: list[SimOutcome]) -> tuple[float | None, str]:
        """Time to run the same simulations one after another, from recorded single runs."""
        if self.options.baseline == "none" or not done:
            return None, "none"
        total = 0.0
        for s in done:
            wall = single_run_baseline(self.store, s.id)
            if wall is None:
                return None, "missing"
            total += wall
        return total, "db"


def _at(values: tuple[tuple[int, int] | None, ...], i: int) -> tuple[int, int] | None:
    return values[i] if i < len(values) else None


def single_run_baseline(store: Store, run_id: int) -> float | None:
    """Median wall time of recorded single (non-multiplexed) completed runs with the same
    case, ranks, iterations, decomposition, weights, budget and wait mode as ``run_id``."""
    return baseline_for_key(store, _config_key(store.get_run(run_id)))


def baseline_for_key(store: Store, key: tuple[Any, ...]) -> float | None:
    walls = [
        r["wall_s"]
        for r in store.list_runs(limit=10_000)
        if r["status"] == "completed"
        and "multiplex_id" not in r["options"]
        and _config_key(r) == key
        and r["wall_s"]
    ]
    return statistics.median(walls) if walls else None


def submission_key(sub: Submission, wait_mode: str) -> tuple[Any, ...]:
    """The key of the single runs that are a baseline for ``sub`` (see `_config_key`)."""
    return (
        Path(sub.case).name, sub.n_ranks, sub.iterations, sub.decompose,
        sub.plan().total_millis, tuple(sub.weights), wait_mode,
    )  # fmt: skip


def _config_key(r: dict[str, Any]) -> tuple[Any, ...]:
    o = r["options"]
    return (
        r["case_name"], r["n_ranks"], o.get("iterations"), r["decompose"],
        r["total_millis"], tuple(o.get("weights") or ()), o.get("wait_mode", "spin"),
    )  # fmt: skip


def phases_from_text(text: str, n_ranks: int) -> tuple[Phase, ...]:
    """``0:500,500,1200,1800;0.34:1000,1000,1000,1000`` -> phases (fraction: per-rank millis)."""
    phases: list[Phase] = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        try:
            frac_text, millis_text = part.split(":", 1)
            frac = float(frac_text)
            millis = tuple(int(x.strip().rstrip("m")) for x in millis_text.split(","))
        except ValueError:
            raise UserError(
                f"phase '{part}' must look like 0.34:1000,1000,1000,1000 "
                "(fraction:per-rank millicores)"
            ) from None
        if not 0 <= frac < 1:
            raise UserError(f"phase start {frac:g} must be in [0, 1)")
        if len(millis) != n_ranks:
            raise UserError(f"phase '{part}' has {len(millis)} requests for {n_ranks} ranks")
        if any(m < 1 for m in millis):
            raise UserError(f"phase '{part}' has a request below 1 millicore")
        if phases and frac <= phases[-1].start_fraction:
            raise UserError("phases must be given in increasing order of their start fraction")
        phases.append(Phase(frac, millis))
    if not phases:
        raise UserError("--phases is empty; give e.g. 0:500,500,1200,1800;0.5:1000,1000,1000,1000")
    return tuple(phases)


def fitted_beta_from_sessions(
    sessions: list[dict[str, Any]], *, capacity_millis: int, wait_mode: str, n_ranks: int
) -> float | None:
    """beta fitted on the recorded sessions comparable with this one (same capacity, wait
    mode and ranks per simulation), or None when they do not give two distinct N."""
    from rankpack.model.contention import ClusterShape, fit_beta, points_from_sessions

    comparable = [
        m for m in sessions
        if m["capacity_millis"] == capacity_millis and m.get("wait_mode") == wait_mode
        and all(s.get("n_ranks") == n_ranks for s in m["summary"].get("simulations", []))
    ]  # fmt: skip
    points = points_from_sessions(comparable)
    if len(points) < 2 or points[0].n != 1:
        return None
    shape = ClusterShape(ranks=n_ranks, nodes=1, cpus_per_node=capacity_millis / 1000)
    try:
        return fit_beta(points, shape).beta
    except UserError:
        return None
