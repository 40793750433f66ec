"""The simulated backend's state: virtual clock, nodes, simulations, resizes in flight.

`SimulatedCluster` is the world every `rankpack.backend.simulated.SimulatedBackend` built on
it shares (a second backend on the same cluster sees what the first launched). The model it
carries out is documented in `rankpack.backend.simulated`; its pure formulas are in
`rankpack.backend.simmodel`. Not thread-safe: one caller at a time.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from rankpack.backend.protocol import (
    BackendError,
    Inventory,
    LaunchFailed,
    NodeCapacity,
    RankObservation,
    RankPhase,
    RankResources,
    ResizeState,
    ResizeStatus,
    SimObservation,
    SimPhase,
    SimRef,
    SimSpec,
    StagedCase,
    StageSpec,
    UnknownSimulation,
)
from rankpack.backend.simmodel import (
    DEFAULT_CASES,
    WAIT_MODES,
    IterationTiming,
    RankFault,
    ResizeScript,
    SimNode,
    SimTiming,
    SimulatedCase,
    cpu_speeds,
    iteration_timing,
    log_end,
    log_header,
    log_iteration,
    log_rank_failure,
    split_cells,
    usage_rate,
)
from rankpack.case.staging import DECOMPOSITIONS

__all__ = ["SimulatedCluster"]

_EPS = 1e-9
_NS = 1_000_000_000
_STOP_EXIT_CODE = 143
"""What mpirun returns when it is terminated by SIGTERM."""
_FAULT_EXIT_CODE = 1


@dataclass
class _InFlight:
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


@dataclass
class _Script:
    script: ResizeScript
    left: int


@dataclass
class _Rank:
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
    in_flight: _InFlight | None = None


@dataclass
class _Sim:
    sim_id: str
    stage_spec: StageSpec
    phase: SimPhase
    ready_at: float
    case: SimulatedCase | None = None
    staged: StagedCase | None = None
    stage_error: str | None = None
    spec: SimSpec | None = None
    ranks: list[_Rank] = field(default_factory=list)
    work_s: tuple[float, ...] = ()
    running_at: float = math.inf
    started_s: float | None = None
    done: int = 0
    frac: float = 0.0
    """Fraction of the current iteration already computed."""
    wait_mode: str = "spin"
    exit_code: int | None = None
    reason: str = ""
    log: list[str] = field(default_factory=list)

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
    ) -> None:
        if not nodes:
            raise ValueError("a simulated cluster needs at least one node")
        self.nodes = nodes
        self.cases = {c.name: c for c in cases}
        self.timing = timing or SimTiming()
        self.create_run_dirs = create_run_dirs
        self.name = name
        self.now = 0.0
        self._sims: dict[str, _Sim] = {}
        self._released: set[str] = set()
        self._faults: list[RankFault] = []
        self._scripts: list[_Script] = []
        self._news = False

    # -- scenario ------------------------------------------------------------------------

    def add_case(self, case: SimulatedCase) -> None:
        self.cases[case.name] = case

    def add_fault(self, fault: RankFault) -> None:
        self._faults.append(fault)

    def script_resize(self, script: ResizeScript) -> None:
        if script.state not in (
            ResizeState.DEFERRED,
            ResizeState.INFEASIBLE,
            ResizeState.REJECTED,
            ResizeState.FAILED,
        ):
            raise ValueError(f"a resize cannot be scripted to be {script.state}")
        self._scripts.append(_Script(script, script.count))

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``, through every event on the way."""
        self._run(self.now + max(0.0, seconds), stop_on_news=False)

    # -- what backends call --------------------------------------------------------------

    def exists(self, sim_id: str) -> bool:
        return sim_id in self._sims

    def get(self, sim_id: str) -> _Sim:
        sim = self._sims.get(sim_id)
        if sim is None:
            what = "was released" if sim_id in self._released else "does not exist"
            raise UnknownSimulation(f"simulation {sim_id} {what} in cluster {self.name}")
        return sim

    def inventory(self) -> Inventory:
        return Inventory(
            tuple(
                NodeCapacity(
                    n.name, n.allocatable_millis, self._requested(n.name), self._ranks(n.name)
                )
                for n in self.nodes
            )
        )

    def stage(self, spec: StageSpec) -> None:
        if spec.sim_id in self._sims:
            raise BackendError(f"simulation {spec.sim_id} already exists")
        self._released.discard(spec.sim_id)
        sim = _Sim(spec.sim_id, spec, SimPhase.STAGING, ready_at=self.now + self.timing.stage_s)
        self._sims[spec.sim_id] = sim
        case = self.cases.get(spec.case) or self.cases.get(Path(spec.case).name)
        error = _stage_error(spec, case, sorted(self.cases))
        if error is not None:
            sim.phase, sim.stage_error, sim.reason = SimPhase.FAILED, error, error
            self._news = True
            return
        sim.case = case
        if sim.ready_at <= self.now:
            self._finish_staging(sim)

    def launch(self, spec: SimSpec) -> None:
        sim = self.get(spec.sim_id)
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
        if spec.shim is not None and spec.shim.wait_mode not in WAIT_MODES:
            raise LaunchFailed(f"unknown wait mode '{spec.shim.wait_mode}'")
        nodes = self._place(spec)
        sim.spec = spec
        sim.ranks = [
            _Rank(i, node, desired=res, allocated=res)
            for i, (node, res) in enumerate(zip(nodes, spec.ranks, strict=True))
        ]
        sim.work_s = tuple(c * sim.case.cell_work_s for c in cells)
        sim.wait_mode = spec.shim.wait_mode if spec.shim else "spin"
        sim.phase, sim.reason = SimPhase.PENDING, "starting"
        sim.running_at = self.now + self.timing.start_s
        if sim.running_at <= self.now:
            self._start(sim)

    def resize(self, sim_id: str, rank: int, resources: RankResources) -> ResizeStatus:
        sim = self.get(sim_id)
        if sim.spec is None:
            raise BackendError(f"simulation {sim_id} has not been launched")
        if not 0 <= rank < len(sim.ranks):
            raise BackendError(f"simulation {sim_id} has no rank {rank}")
        r = sim.ranks[rank]
        status = ResizeStatus(
            ResizeState.PENDING,
            from_millis=r.allocated.request_millis,
            to_millis=resources.request_millis,
            requested_t_s=self.now,
        )
        script = self._take_script(sim_id, rank)
        reject = self._rejection(sim, r, resources)
        if reject is None and script is not None and script.state is ResizeState.REJECTED:
            reject = script.reason or "rejected (scripted)"
        if reject is not None:
            r.resize = replace(status, state=ResizeState.REJECTED, latency_s=0.0, reason=reject)
            return r.resize
        r.desired = resources
        flight = _InFlight(status, resources, ResizeState.COMPLETED)
        r.in_flight = flight
        if script is not None and script.state is ResizeState.DEFERRED:
            flight.deferred_until = self.now + script.defer_s
            flight.reason = script.reason or "deferred (scripted)"
            r.resize = replace(status, state=ResizeState.DEFERRED, reason=flight.reason)
            return r.resize
        if script is not None:
            flight.outcome = script.state
            flight.reason = script.reason or f"{script.state} (scripted)"
        r.resize = status
        self._accept(sim, r, fresh=True)
        if r.in_flight is None or flight.target.request_millis < status.from_millis:
            self._retry_deferred()
        assert r.resize is not None
        return r.resize

    def set_wait_mode(self, sim_id: str, mode: str) -> None:
        sim = self.get(sim_id)
        if mode not in WAIT_MODES:
            raise BackendError(f"unknown wait mode '{mode}'; use one of {', '.join(WAIT_MODES)}")
        if sim.spec is None or sim.spec.shim is None:
            raise BackendError(f"simulation {sim_id} runs without the shim")
        if sim.started_s is None:
            raise BackendError(
                f"simulation {sim_id}: the ranks have not started, no live record is published"
                " yet; try again"
            )
        sim.wait_mode = mode

    def observe(self, sim_id: str) -> SimObservation:
        sim = self.get(sim_id)
        timing = self._timings().get(sim_id) if sim.phase is SimPhase.RUNNING else None
        shim = sim.spec is not None and sim.spec.shim is not None and sim.started_s is not None
        ranks = tuple(
            RankObservation(
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
            t_s=self.now,
            phase=sim.phase,
            ranks=ranks,
            exit_code=sim.exit_code,
            reason=sim.reason,
            staged=sim.staged,
            stage_error=sim.stage_error,
        )

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
            self._end(sim, SimPhase.FAILED, _STOP_EXIT_CODE, "stopped", "terminated")
        else:
            sim.phase, sim.reason = SimPhase.FAILED, "stopped before launch"
            self._news = True

    def release(self, sim_id: str) -> None:
        if sim_id in self._released:
            return
        self.stop(sim_id)
        del self._sims[sim_id]
        self._released.add(sim_id)
        self._faults = [f for f in self._faults if f.sim_id != sim_id]

    def sim_refs(self) -> tuple[SimRef, ...]:
        return tuple(
            SimRef(s.sim_id, s.phase, dict(s.spec.labels) if s.spec else {})
            for s in self._sims.values()
        )

    def check_adoptable(self, sim_id: str, spec: SimSpec) -> None:
        sim = self.get(sim_id)
        if sim.spec is None:
            raise BackendError(f"simulation {sim_id} was never launched; stage it again")
        if spec.sim_id != sim_id or len(spec.ranks) != len(sim.ranks):
            raise BackendError(
                f"the spec ({spec.sim_id}, {len(spec.ranks)} ranks) does not describe "
                f"{sim_id} ({len(sim.ranks)} ranks)"
            )

    # -- time ----------------------------------------------------------------------------

    def _run(self, target: float, *, stop_on_news: bool) -> None:
        if self._process_due() and stop_on_news:
            return
        while self.now < target:
            self._integrate(min(self._next_event_s(), target))
            if self._process_due() and stop_on_news:
                return

    def _next_event_s(self) -> float:
        times: list[float] = []
        timings = self._timings()
        for sim in self._sims.values():
            if sim.phase is SimPhase.STAGING:
                times.append(sim.ready_at)
            elif sim.phase is SimPhase.PENDING:
                times.append(sim.running_at)
            elif sim.phase is SimPhase.RUNNING:
                left = sim.total - sim.done - sim.frac
                times.append(self.now + left * timings[sim.sim_id].iteration_s)
            for r in sim.ranks:
                f = r.in_flight
                if f is not None:
                    times += [
                        t
                        for t in (f.deferred_until, f.in_progress_at, f.settle_at)
                        if t is not None
                    ]
        times += [f.at_s for f in self._faults if self._sims.get(f.sim_id, _NONE).active]
        return min((t for t in times if t > self.now), default=math.inf)

    def _integrate(self, t1: float) -> None:
        """Advance every running simulation from ``now`` to ``t1`` (speeds constant)."""
        dt = t1 - self.now
        if dt > 0:
            for sim_id, timing in self._timings().items():
                self._integrate_sim(self._sims[sim_id], timing, dt)
        self.now = t1

    def _integrate_sim(self, sim: _Sim, timing: _Timing, dt: float) -> None:
        t_s, t0 = timing.iteration_s, self.now
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
            if sim.phase is SimPhase.RUNNING and sim.done >= sim.total:
                sim.log.append(log_end(sim.total if sim.converged else None))
                self._end(sim, SimPhase.SUCCEEDED, 0, "", "")
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
        for sim in self._sims.values():
            for r in sim.ranks:
                f = r.in_flight
                if f is None:
                    continue
                if f.deferred_until is not None and f.deferred_until <= due:
                    self._accept(sim, r, fresh=False)
                if f.in_progress_at is not None and f.in_progress_at <= due:
                    f.in_progress_at = None
                    r.resize = replace(f.status, state=ResizeState.IN_PROGRESS)
                if f.settle_at is not None and f.settle_at <= due:
                    self._settle(r)
                news = news or r.in_flight is None
        return self._retry_deferred() or news

    # -- transitions ---------------------------------------------------------------------

    def _finish_staging(self, sim: _Sim) -> None:
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
        if self.create_run_dirs:
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                sim.phase, sim.stage_error = SimPhase.FAILED, f"cannot create {run_dir}: {e}"
                sim.reason = sim.stage_error
                return
        sim.staged = StagedCase(
            run_dir=run_dir,
            case_name=case.name,
            case_source=f"simulated:{case.name}",
            solver=case.solver,
            cells_per_rank=split_cells(case.cells, weights),
            expected_iterations=spec.iterations or case.iterations,
        )
        sim.phase, sim.reason = SimPhase.STAGED, ""

    def _start(self, sim: _Sim) -> None:
        sim.phase, sim.reason, sim.started_s = SimPhase.RUNNING, "", self.now
        for r in sim.ranks:
            r.phase = RankPhase.RUNNING
        assert sim.case is not None
        sim.log.append(log_header(sim.case.name, sim.case.solver, len(sim.ranks)))

    def _end(
        self, sim: _Sim, phase: SimPhase, exit_code: int, reason: str, rank_reason: str
    ) -> None:
        sim.phase, sim.exit_code, sim.reason = phase, exit_code, reason
        rank_phase = RankPhase.SUCCEEDED if phase is SimPhase.SUCCEEDED else RankPhase.FAILED
        for r in sim.ranks:
            if r.phase is not RankPhase.FAILED:
                r.phase, r.reason = rank_phase, rank_reason
            if r.in_flight is not None:
                r.resize = replace(
                    r.in_flight.status,
                    state=ResizeState.FAILED,
                    latency_s=self.now - r.in_flight.status.requested_t_s,
                    reason="simulation ended",
                )
                r.in_flight = None
        self._news = True
        self._retry_deferred()

    def _apply_fault(self, sim: _Sim, fault: RankFault) -> None:
        if not 0 <= fault.rank < len(sim.ranks):
            return
        r = sim.ranks[fault.rank]
        if fault.restart:
            r.restarts += 1
            r.reason = f"restarted: {fault.reason}"
            sim.frac = 0.0
            return
        r.phase, r.reason = RankPhase.FAILED, fault.reason
        sim.log.append(log_rank_failure(fault.rank, r.node, fault.reason))
        self._end(
            sim,
            SimPhase.FAILED,
            _FAULT_EXIT_CODE,
            f"rank {fault.rank} failed: {fault.reason}",
            f"terminated: rank {fault.rank} failed",
        )

    # -- resizes -------------------------------------------------------------------------

    def _rejection(self, sim: _Sim, r: _Rank, res: RankResources) -> str | None:
        node = self._node(r.node)
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

    def _accept(self, sim: _Sim, r: _Rank, *, fresh: bool) -> None:
        """Start applying ``r``'s resize, or defer it until the node has room."""
        f = r.in_flight
        assert f is not None
        grows = f.target.request_millis > r.allocated.request_millis
        if f.outcome is ResizeState.COMPLETED and grows and not self._fits(r, f.target):
            node = self._node(r.node)
            free = max(0, node.allocatable_millis - self._requested(node.name))
            f.deferred_until = math.inf
            f.reason = f"node {node.name} has {free}m free"
            r.resize = replace(f.status, state=ResizeState.DEFERRED, reason=f.reason)
            return
        f.deferred_until = None
        latency = self.timing.resize_latency_s
        if latency <= 0:
            self._settle(r)
            return
        f.settle_at = self.now + latency
        if fresh:
            f.in_progress_at = self.now + latency / 2
            r.resize = f.status
        else:
            r.resize = replace(f.status, state=ResizeState.IN_PROGRESS)

    def _settle(self, r: _Rank) -> None:
        f = r.in_flight
        assert f is not None
        r.in_flight = None
        latency = self.now - f.status.requested_t_s
        if f.outcome is ResizeState.COMPLETED:
            r.allocated = f.target
            r.resize = replace(f.status, state=ResizeState.COMPLETED, latency_s=latency)
        else:
            r.resize = replace(f.status, state=f.outcome, latency_s=latency, reason=f.reason)

    def _retry_deferred(self) -> bool:
        """Accept resizes deferred for lack of room that now fit (oldest first)."""
        waiting = sorted(
            (
                (r.in_flight.status.requested_t_s, sim.sim_id, r.index)
                for sim in self._sims.values()
                if sim.active
                for r in sim.ranks
                if r.in_flight is not None and r.in_flight.deferred_until == math.inf
            ),
        )
        news = False
        for _, sim_id, index in waiting:
            sim = self._sims[sim_id]
            r = sim.ranks[index]
            assert r.in_flight is not None
            if self._fits(r, r.in_flight.target):
                self._accept(sim, r, fresh=False)
                news = news or r.in_flight is None
        return news

    # -- capacity and speeds -------------------------------------------------------------

    def _node(self, name: str) -> SimNode:
        return next(n for n in self.nodes if n.name == name)

    def _charge(self, r: _Rank) -> int:
        """Millicores ``r`` holds on its node: an accepted increase counts while in flight."""
        f = r.in_flight
        if f is not None and f.deferred_until is None and f.outcome is ResizeState.COMPLETED:
            return max(r.allocated.request_millis, f.target.request_millis)
        return r.allocated.request_millis

    def _ranks(self, node: str) -> int:
        return sum(1 for s in self._sims.values() if s.active for r in s.ranks if r.node == node)

    def _requested(self, node: str) -> int:
        return self._node(node).reserved_millis + sum(
            self._charge(r)
            for sim in self._sims.values()
            if sim.active
            for r in sim.ranks
            if r.node == node
        )

    def _fits(self, r: _Rank, target: RankResources) -> bool:
        node = self._node(r.node)
        others = self._requested(node.name) - self._charge(r)
        need = max(r.allocated.request_millis, target.request_millis)
        return others + need <= node.allocatable_millis

    def _place(self, spec: SimSpec) -> list[str]:
        pinned = spec.placement.get("node")
        if pinned is not None:
            if pinned not in {n.name for n in self.nodes}:
                raise LaunchFailed(f"no node {pinned} in cluster {self.name}")
            return [pinned] * len(spec.ranks)
        free = {n.name: n.allocatable_millis - self._requested(n.name) for n in self.nodes}
        total = sum(r.request_millis for r in spec.ranks)
        for n in self.nodes:
            if free[n.name] >= total:
                return [n.name] * len(spec.ranks)
        out = []
        for res in spec.ranks:
            best = max(self.nodes, key=lambda n: free[n.name]).name
            out.append(best)
            free[best] -= res.request_millis
        return out

    def _timings(self) -> dict[str, _Timing]:
        """Iteration timing of every running simulation at the current speeds."""
        running = [s for s in self._sims.values() if s.phase is SimPhase.RUNNING]
        speeds: dict[tuple[str, int], float] = {}
        for node in self.nodes:
            members = [
                (s.sim_id, r)
                for s in running
                for r in s.ranks
                if r.node == node.name and r.phase is RankPhase.RUNNING
            ]
            weights = [float(max(2, r.allocated.request_millis)) for _, r in members]
            caps = [min(1.0, (r.allocated.limit_millis or 1000) / 1000) for _, r in members]
            if node.reserved_millis > 0:
                weights.append(float(node.reserved_millis))
                caps.append(node.reserved_millis / 1000)
            shares = cpu_speeds(node.allocatable_millis / 1000, weights, caps)
            for (sim_id, r), share in zip(members, shares, strict=False):
                speeds[(sim_id, r.index)] = share
        out = {}
        for sim in running:
            assert sim.case is not None
            rank_speeds = tuple(speeds.get((sim.sim_id, r.index), 0.0) for r in sim.ranks)
            t = iteration_timing(sim.work_s, rank_speeds, sim.case.mpi_s_per_iteration)
            out[sim.sim_id] = _Timing(t.iteration_s, t.duty, rank_speeds)
        return out


@dataclass(frozen=True)
class _Timing(IterationTiming):
    speeds: tuple[float, ...] = ()


_NONE = _Sim("", StageSpec("", "", 1, Path()), SimPhase.FAILED, 0.0)
"""Stands for a simulation that is not there (its ``active`` is False)."""


def _stage_error(spec: StageSpec, case: SimulatedCase | None, known: list[str]) -> str | None:
    if case is None:
        return f"unknown case '{spec.case}'; the simulated cluster knows {', '.join(known)}"
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
