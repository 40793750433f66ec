"""The simulated cluster's world and clock: simulations staged, launched, run and ended.

`SimulatedCluster` is the world every `rankpack.testing.simulated.SimulatedBackend` built on
it shares (a second backend on the same cluster sees what the first launched). It holds the
virtual clock and the simulations (`simstate`), moves them through time (staging, start,
iterations, faults, end) and answers the backends' calls; the nodes' load and the ranks'
speeds are `simnodes`, resizes in flight `simresizes`, the pure formulas `simmodel`. The
model it carries out is documented in `rankpack.testing.simulated`. Not thread-safe: one
caller at a time.

Its cost grows with what changes, so that a thousand nodes and ten thousand ranks run in
seconds (`bench/scale.py`): a simulation's counters and iterations are integrated lazily
(`_sync`: when it is observed, and before anything changes its speeds), the nodes' load
is kept incrementally (`simnodes`), and only resizes in flight are looked at. With an
`ApiModel` (`simapi`) it counts the apiserver requests a Kubernetes backend would make and
delays launches and resizes by them.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from rankpack.backend.protocol import (
    BackendError,
    Inventory,
    LaunchFailed,
    RankObservation,
    RankPhase,
    RankResources,
    ResizeStatus,
    SimObservation,
    SimPhase,
    SimRef,
    SimSpec,
    StagedCase,
    StageSpec,
    UnknownSimulation,
)
from rankpack.core.actions import UnknownWaitMode, WaitMode, parse_wait_mode
from rankpack.core.failures import FailureCode
from rankpack.testing.simapi import DELETE_REQUESTS, OBJECTS_PER_LAUNCH, ApiModel
from rankpack.testing.simmodel import (
    DEFAULT_CASES,
    RankFault,
    ResizeScript,
    SimNode,
    SimTiming,
    SimulatedCase,
    log_end,
    log_header,
    log_iteration,
    log_rank_failure,
    split_cells,
    usage_rate,
)
from rankpack.testing.simnodes import SimNodeLoad, Timing
from rankpack.testing.simresizes import SimResizes
from rankpack.testing.simstate import ABSENT, SimRank, SimRun, stage_error

__all__ = ["SimulatedCluster"]

_EPS = 1e-9
_RANK_DEFAULTS = {f.name: f.default for f in fields(RankObservation) if f.default is not MISSING}


def _rank_observation(**values: Any) -> RankObservation:
    """``RankObservation(**values)`` without the frozen dataclass's generated ``__init__``
    (2 of its ~3 microseconds; `observe` builds one per rank, and a tick of ten thousand
    ranks observes about a thousand): the same object, its defaults, then ``values``."""
    obs = object.__new__(RankObservation)
    obs.__dict__.update(_RANK_DEFAULTS)
    obs.__dict__.update(values)
    return obs


_NS = 1_000_000_000
_STOP_EXIT_CODE = 143
"""What mpirun returns when it is terminated by SIGTERM."""
_FAULT_EXIT_CODE = 1


class SimulatedCluster:
    """The simulated world shared by every `SimulatedBackend` built on it (see module doc)."""

    def __init__(
        self,
        nodes: tuple[SimNode, ...] = (SimNode("sim-node-0", 4000),),
        cases: tuple[SimulatedCase, ...] = DEFAULT_CASES,
        timing: SimTiming | None = None,
        *,
        create_run_dirs: bool = True,
        name: str = "sim",
        api: ApiModel | None = None,
    ) -> None:
        if not nodes:
            raise ValueError("a simulated cluster needs at least one node")
        self.nodes = nodes
        self.cases = {c.name: c for c in cases}
        self.timing = timing or SimTiming()
        self.create_run_dirs = create_run_dirs
        self.name = name
        self.now = 0.0
        self._sims: dict[str, SimRun] = {}
        self._released: set[str] = set()
        self._faults: list[RankFault] = []
        self._news = False
        self.api = api
        """The apiserver's cost model (None: requests are free and instant)."""
        self.news_seq: dict[str, int] = {}
        """Per simulation, the number of the last event that was news about it (it ended,
        failed, a rank restarted); backends compare it with what they took
        (`SimulatedBackend.changed`)."""
        self._seq = 0
        self._load = SimNodeLoad(nodes, self._sims, name)
        self._resizes = SimResizes(self._load, self._sims, self.timing, lambda: self.now,
                                before_settle=lambda r: self._sync_nodes([r.node]))  # fmt: skip

    # -- scenario ------------------------------------------------------------------------

    def add_fault(self, fault: RankFault) -> None:
        self._faults.append(fault)

    def script_resize(self, script: ResizeScript) -> None:
        """Force the outcome of the next matching resizes (DEFERRED, INFEASIBLE, REJECTED or
        FAILED; ValueError otherwise)."""
        self._resizes.script(script)

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``, through every event on the way."""
        self._run(self.now + max(0.0, seconds), stop_on_news=False)

    # -- what backends call --------------------------------------------------------------

    def exists(self, sim_id: str) -> bool:
        return sim_id in self._sims

    def get(self, sim_id: str) -> SimRun:
        sim = self._sims.get(sim_id)
        if sim is None:
            what = "was released" if sim_id in self._released else "does not exist"
            raise UnknownSimulation(f"simulation {sim_id} {what} in cluster {self.name}")
        return sim

    def inventory(self) -> Inventory:
        if self.api is not None:
            self.api.read(self.now, "list", 2)  # nodes, and every pod of the cluster
        return self._load.inventory()

    def stage(self, spec: StageSpec) -> None:
        if spec.sim_id in self._sims:
            raise BackendError(f"simulation {spec.sim_id} already exists")
        self._released.discard(spec.sim_id)
        sim = SimRun(spec.sim_id, spec, SimPhase.STAGING, ready_at=self.now + self.timing.stage_s)
        self._sims[spec.sim_id] = sim
        case = self.cases.get(spec.case) or self.cases.get(Path(spec.case).name)
        error = stage_error(spec, case, sorted(self.cases))
        if error is not None:
            code, sim.stage_error = error
            sim.fail(code, sim.stage_error)
            self._news = True
            return
        sim.case = case
        if sim.ready_at <= self.now:
            self._finish_staging(sim)

    def launch(self, spec: SimSpec) -> None:
        sim = self.get(spec.sim_id)
        _check_launch(sim, spec)
        assert sim.staged is not None and sim.case is not None
        cells = sim.staged.cells_per_rank
        nodes = self._load.place(spec)
        sim.spec = spec
        sim.ranks = [
            SimRank(i, node, desired=res, allocated=res)
            for i, (node, res) in enumerate(zip(nodes, spec.ranks, strict=True))
        ]
        sim.work_s = tuple(c * sim.case.cell_work_s for c in cells)
        sim.wait_mode = spec.shim.wait_mode if spec.shim else "spin"
        sim.phase, sim.reason = SimPhase.PENDING, "starting"
        self._load.activate(sim)
        created = self.now
        if self.api is not None:  # its pods, owner ConfigMap and Service
            created = self.api.write(self.now, "create", len(spec.ranks) + OBJECTS_PER_LAUNCH)
        sim.running_at = created + self.timing.start_s
        if sim.running_at <= self.now:
            self._start(sim)

    def resize(self, sim_id: str, rank: int, resources: RankResources) -> ResizeStatus:
        sim = self.get(sim_id)
        if sim.spec is None:
            raise BackendError(f"simulation {sim_id} has not been launched")
        if not 0 <= rank < len(sim.ranks):
            raise BackendError(f"simulation {sim_id} has no rank {rank}")
        arrives = self.api.write(self.now, "patch") if self.api is not None else None
        return self._resizes.request(sim, sim.ranks[rank], resources, arrives)

    def set_wait_mode(self, sim_id: str, mode: WaitMode) -> None:
        sim = self.get(sim_id)
        _check_wait_mode(sim, mode)
        self._sync(sim)  # what it burned so far, in the mode it had
        sim.wait_mode = mode

    def observe(self, sim_id: str) -> SimObservation:
        sim = self.get(sim_id)
        if self.api is not None:
            self.api.read(self.now, "list")  # its pods
        self._sync(sim)
        timing = self._load.timings().get(sim_id) if sim.phase is SimPhase.RUNNING else None
        return _observation(sim, self.now, timing)

    def log_chunks(self, sim_id: str) -> list[str]:
        return self.get(sim_id).log

    def wait(self, timeout_s: float) -> None:
        if self._news:
            self._news = False
            return
        self._run(self.now + max(0.0, timeout_s), stop_on_news=True)
        self._news = False

    def stop(self, sim_id: str) -> None:
        if sim_id in self._released:
            return
        sim = self.get(sim_id)
        if sim.phase.ended:
            return
        if sim.active:
            self._end(sim, _STOP_EXIT_CODE, "stopped", "terminated", FailureCode.STOPPED)
        else:
            sim.fail(FailureCode.STOPPED, "stopped before launch")
            self._news = True

    def release(self, sim_id: str) -> None:
        if sim_id in self._released:
            return
        self.stop(sim_id)
        if self.api is not None and self._sims[sim_id].spec is not None:
            self.api.write(self.now, "delete", DELETE_REQUESTS)  # pods, ConfigMap, Service
        del self._sims[sim_id]
        self.news_seq.pop(sim_id, None)
        self._released.add(sim_id)
        self._faults = [f for f in self._faults if f.sim_id != sim_id]

    def sim_refs(self) -> tuple[SimRef, ...]:
        return tuple(
            SimRef(s.sim_id, s.phase, dict(s.spec.labels) if s.spec else {})
            for s in self._sims.values()
        )

    def check_adoptable(self, sim_id: str, spec: SimSpec) -> None:
        _check_adoptable(self.get(sim_id), spec)

    # -- time ----------------------------------------------------------------------------

    def _run(self, target: float, *, stop_on_news: bool) -> None:
        if self._process_due() and stop_on_news:
            return
        while self.now < target:
            # nothing changes speed on the way: the running simulations are brought up to
            # date only when needed (`_sync`)
            self.now = max(self.now, min(self._next_event_s(), target))
            if self._process_due() and stop_on_news:
                return

    def _next_event_s(self) -> float:
        times: list[float] = []
        for sim in self._sims.values():
            if sim.phase is SimPhase.STAGING:
                times.append(sim.ready_at)
            elif sim.phase is SimPhase.PENDING:
                times.append(sim.running_at)
            elif sim.phase is SimPhase.RUNNING:
                times.append(self._end_s(sim))
        for r in self._resizes.flying.values():
            times += self._resizes.due_times(r)
        times += [f.at_s for f in self._faults if self._sims.get(f.sim_id, ABSENT).active]
        return min((t for t in times if t > self.now), default=math.inf)

    def _end_s(self, sim: SimRun) -> float:
        """When a running simulation does its last iteration at its current speeds."""
        left = sim.total - sim.done - sim.frac
        return sim.synced_s + left * self._load.timings()[sim.sim_id].iteration_s

    def _sync(self, sim: SimRun) -> None:
        """Integrate ``sim``'s counters and iterations from ``synced_s`` to ``now``."""
        if sim.phase is SimPhase.RUNNING and self.now > sim.synced_s:
            _integrate_sim(sim, self._load.timings()[sim.sim_id], self.now - sim.synced_s)
        sim.synced_s = self.now

    def _sync_nodes(self, nodes: list[str]) -> None:
        """Bring every running simulation on ``nodes`` up to date: their speeds are about
        to change."""
        for sim_id in sorted(self._load.sims_on(nodes)):
            self._sync(self._sims[sim_id])

    def _process_due(self) -> bool:
        """Carry out everything due at ``now``; True if any of it is news."""
        news = False
        due = self.now + _EPS
        for sim in list(self._sims.values()):
            if sim.phase is SimPhase.STAGING and sim.ready_at <= due:
                self._finish_staging(sim)
                news = True
            elif sim.phase is SimPhase.PENDING and sim.running_at <= due:
                self._start(sim)
                news = True
            if sim.phase is SimPhase.RUNNING and (sim.done >= sim.total or self._end_s(sim) <= due):
                self._sync(sim)
                if sim.done < sim.total:
                    continue
                sim.log.append(log_end(sim.total if sim.converged else None))
                self._end(sim, 0, "", "")
                news = True
        for fault in list(self._faults):
            target = self._sims.get(fault.sim_id)
            if target is None or not target.active or fault.at_s > due:
                if target is not None and target.phase.ended:
                    self._faults.remove(fault)
                continue
            self._faults.remove(fault)
            self._apply_fault(target, fault)
            news = True
        for r in list(self._resizes.flying.values()):
            news = self._resizes.process_due(r, due) or news
        return self._resizes.retry_deferred() or news

    # -- transitions ---------------------------------------------------------------------

    def _touch(self, sim: SimRun) -> None:
        self._seq += 1
        self.news_seq[sim.sim_id] = self._seq

    def _finish_staging(self, sim: SimRun) -> None:
        _finish_staging(sim, self.create_run_dirs)

    def _start(self, sim: SimRun) -> None:
        self._sync_nodes([r.node for r in sim.ranks])  # they share their cores from now on
        sim.phase, sim.reason, sim.started_s = SimPhase.RUNNING, "", self.now
        sim.synced_s = self.now
        self._load.start(sim)
        for r in sim.ranks:
            r.phase = RankPhase.RUNNING
        assert sim.case is not None
        sim.log.append(log_header(sim.case.name, sim.case.solver, len(sim.ranks)))

    def _end(
        self,
        sim: SimRun,
        exit_code: int,
        reason: str,
        rank_reason: str,
        failure: FailureCode | None = None,
    ) -> None:
        """End a launched simulation: SUCCEEDED without ``failure``, else FAILED with it."""
        self._sync_nodes([r.node for r in sim.ranks])  # itself, and those sharing its cores
        phase = SimPhase.SUCCEEDED if failure is None else SimPhase.FAILED
        sim.phase, sim.exit_code, sim.reason, sim.failure = phase, exit_code, reason, failure
        rank_phase = RankPhase.SUCCEEDED if phase is SimPhase.SUCCEEDED else RankPhase.FAILED
        for r in sim.ranks:
            if r.phase is not RankPhase.FAILED:
                r.phase, r.reason = rank_phase, rank_reason
            self._resizes.abandon(r)
        self._load.deactivate(sim)
        self._touch(sim)
        self._news = True
        self._resizes.retry_deferred()

    def _apply_fault(self, sim: SimRun, fault: RankFault) -> None:
        if not 0 <= fault.rank < len(sim.ranks):
            return
        r = sim.ranks[fault.rank]
        if fault.restart:
            self._sync(sim)
            self._touch(sim)
            r.restarts += 1
            r.reason = f"restarted: {fault.reason}"
            sim.frac = 0.0
            return
        r.phase, r.reason = RankPhase.FAILED, fault.reason
        sim.log.append(log_rank_failure(fault.rank, r.node, fault.reason))
        self._end(
            sim,
            _FAULT_EXIT_CODE,
            f"rank {fault.rank} failed: {fault.reason}",
            f"terminated: rank {fault.rank} failed",
            FailureCode.RANK_FAILED,
        )


def _check_launch(sim: SimRun, spec: SimSpec) -> None:
    """LaunchFailed unless ``spec`` may launch ``sim`` (staged, its ranks, their requests,
    the wait mode)."""
    if sim.phase is not SimPhase.STAGED or sim.staged is None or sim.case is None:
        raise LaunchFailed(f"simulation {spec.sim_id} is {sim.phase}, not staged")
    cells = sim.staged.cells_per_rank
    if len(spec.ranks) != len(cells):
        raise LaunchFailed(
            f"{spec.sim_id} was staged for {len(cells)} ranks, not {len(spec.ranks)}"
        )
    bad = [r for r in spec.ranks if r.request_millis < 1]
    if bad:
        raise LaunchFailed(f"every rank needs a request of at least 1m, got {bad[0]}")
    if spec.shim is not None:
        try:
            parse_wait_mode(spec.shim.wait_mode)
        except UnknownWaitMode as exc:
            raise LaunchFailed(str(exc)) from None


def _observation(sim: SimRun, now: float, timing: Timing | None) -> SimObservation:
    """What a backend observes of ``sim`` at ``now`` (its counters integrated up to it)."""
    sim_id = sim.sim_id
    shim = sim.spec is not None and sim.spec.shim is not None and sim.started_s is not None
    ranks = tuple(
        _rank_observation(
            rank=r.index,
            phase=r.phase,
            desired=r.desired,
            allocated=None if r.phase is RankPhase.PENDING else r.allocated,
            usage_ns=round(r.usage_s * _NS),
            restarts=r.restarts,
            reason=r.reason,
            node=r.node,
            pod=f"{sim_id}-rank-{r.index}",
            resize=r.resize,
            compute_ns=round(r.compute_s * _NS) if shim else None,
            mpi_ns=round(r.mpi_s * _NS) if shim else None,
            duty_window=timing.duty[r.index] if shim and timing is not None else None,
            wait_mode=sim.wait_mode if shim else None,
        )
        for r in sim.ranks
    )
    return SimObservation(
        sim_id=sim_id,
        t_s=now,
        phase=sim.phase,
        ranks=ranks,
        exit_code=sim.exit_code,
        reason=sim.reason,
        failure=sim.failure,
        staged=sim.staged,
        stage_error=sim.stage_error,
    )


def _finish_staging(sim: SimRun, create_run_dirs: bool) -> None:
    """``sim``'s case staged: its run directory and `StagedCase` (FAILED when the
    directory cannot be created)."""
    spec, case = sim.stage_spec, sim.case
    assert case is not None
    n = spec.n_ranks
    weights = (
        [1.0] * n
        if spec.decompose == "equal" or not spec.decompose_weights
        else list(spec.decompose_weights)
    )
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", case.name)
    run_dir = (
        spec.workdir.expanduser()
        if spec.workdir is not None
        else spec.runs_root / f"{spec.sim_id}-{safe}-{n}r"
    )
    if create_run_dirs:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            sim.stage_error = f"cannot create {run_dir}: {e}"
            sim.fail(FailureCode.STAGE_FAILED, sim.stage_error)
            return
    sim.staged = StagedCase(
        run_dir=run_dir,
        case_name=case.name,
        case_source=f"simulated:{case.name}",
        solver=case.solver,
        cells_per_rank=split_cells(case.cells, weights),
        expected_iterations=spec.iterations or case.iterations,
        mpi=case.mpi,
    )
    sim.phase, sim.reason = SimPhase.STAGED, ""


def _integrate_sim(sim: SimRun, timing: Timing, dt: float) -> None:
    """``sim``'s iterations, log and counters over ``dt`` seconds at ``timing``."""
    t_s, t0 = timing.iteration_s, sim.synced_s
    speeds = timing.speeds
    rates = [usage_rate(s, d, sim.wait_mode) for s, d in zip(speeds, timing.duty, strict=True)]
    if math.isfinite(t_s) and sim.started_s is not None:
        progress = sim.frac + dt / t_s
        n = min(math.floor(progress + _EPS), sim.total - sim.done)
        for k in range(1, n + 1):
            tc = t0 + (k - sim.frac) * t_s
            execution_s = sim.ranks[0].usage_s + rates[0] * (tc - t0)
            sim.log.append(log_iteration(sim.done + k, execution_s, tc - sim.started_s))
        sim.done += n
        sim.frac = 0.0 if sim.done >= sim.total else max(0.0, progress - n)
    for r, rate, duty in zip(sim.ranks, rates, timing.duty, strict=True):
        r.usage_s += rate * dt
        r.compute_s += duty * dt
        r.mpi_s += (1.0 - duty) * dt


def _check_wait_mode(sim: SimRun, mode: WaitMode) -> None:
    """BackendError unless ``sim``'s ranks can switch to ``mode`` now."""
    try:
        parse_wait_mode(mode)
    except UnknownWaitMode as exc:
        raise BackendError(str(exc)) from None
    if sim.spec is None or sim.spec.shim is None:
        raise BackendError(f"simulation {sim.sim_id} runs without the shim")
    if sim.started_s is None:
        raise BackendError(
            f"simulation {sim.sim_id}: the ranks have not started, no live record is published"
            " yet; try again"
        )


def _check_adoptable(sim: SimRun, spec: SimSpec) -> None:
    """BackendError unless ``spec`` describes ``sim``, launched."""
    if sim.spec is None:
        raise BackendError(f"simulation {sim.sim_id} was never launched; stage it again")
    if spec.sim_id != sim.sim_id or len(spec.ranks) != len(sim.ranks):
        raise BackendError(
            f"the spec ({spec.sim_id}, {len(spec.ranks)} ranks) does not describe "
            f"{sim.sim_id} ({len(sim.ranks)} ranks)"
        )
