"""The one control loop: policy x backend x clock, for `rankpack run` and `multiplex` alike.

Every tick (about once a second, earlier when the backend reports an event) the loop

1. observes every simulation it holds through the backend (phase, per-rank counters, the
   shim's duty counters, new solver-log text, the state of in-flight resizes),
2. records samples, resizes, restarts and ends in the store,
3. builds `Observations` and calls the pure decision step `policy.decide`,
4. applies the actions: `Launch` claims the queue entry and asks the backend to *stage* it
   (asynchronous: a staging simulation never blocks the others; it is launched on a later
   tick once staged), `Resize` asks the backend for an in-place resize whose outcome is
   followed in later observations, `SetWaitMode` asks the backend to switch how the ranks
   wait in MPI (live; refused switches are asked for again on the next tick), `Note` is
   recorded as an event,
5. waits on the backend's clock for the next event of any simulation.

`rankpack run` is a queue of one (`OneJob`) with the same loop; `rankpack multiplex` reads
the store's queue (`StoreQueue`). The loop owns no backend-specific notion: cgroups, pods,
pid files and record files are the backends' business.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from rankpack.backend.protocol import (
    Backend,
    BackendError,
    RankResources,
    ResizeState,
    ShimSpec,
    SimObservation,
    SimPhase,
    SimSpec,
    StagedCase,
    StageSpec,
)
from rankpack.case.foamlog import LogParser, LogState
from rankpack.case.openfoam import rank_env
from rankpack.controller import waits
from rankpack.controller.learned import LearnedSizes, learnable, learned_sizes
from rankpack.controller.observations import (
    ControllerSettings,
    ControllerState,
    NodeCores,
    Observations,
    QueuedSim,
    RankSnapshot,
    SimSnapshot,
    WaitMode,
    WaitSetting,
)
from rankpack.controller.policy import decide
from rankpack.controller.submission import Submission
from rankpack.core.accounting import trapezoid_cpu_s
from rankpack.core.actions import WAIT_SETTINGS, Action, Launch, Note, Resize, SetWaitMode
from rankpack.core.results import CONVERGED, RankResult, ResizeRecord, RunResult, WaitRecord
from rankpack.errors import UserError
from rankpack.plan.allocation import Plan, proportional_millis
from rankpack.store import NewRun, RankRow, SampleRow, Store

# -- the queue the loop takes work from ---------------------------------------------------


@dataclass(frozen=True)
class Job:
    queue_id: int
    submission: Submission


class JobSource(Protocol):
    def pending(self) -> list[Job]:
        """Waiting jobs, first to launch first."""
        ...

    def claim(self, job: Job) -> bool:
        """Take the job for this loop; False if another session has it."""
        ...

    def started(self, job: Job, run_id: int, sim_id: str, staged: StagedCase) -> None:
        """The job was staged and is being launched as simulation ``sim_id``."""
        ...

    def finished(self, job: Job, status: str, message: str = "") -> None:
        """The job ended (``message``: why, when it failed before it had a run)."""
        ...

    def heartbeat(self, jobs: Sequence[Job]) -> None: ...

    def held(self, job: Job, code: str, reason: str) -> None:
        """The job waits in the queue for this reason (the policy's ``launch-held`` code)."""
        ...


class OneJob:
    """A queue of one, in memory: `rankpack run`."""

    def __init__(self, submission: Submission) -> None:
        self.job = Job(0, submission)
        self.taken = False

    def pending(self) -> list[Job]:
        return [] if self.taken else [self.job]

    def claim(self, job: Job) -> bool:
        if self.taken:
            return False
        self.taken = True
        return True

    def started(self, job: Job, run_id: int, sim_id: str, staged: StagedCase) -> None:
        pass

    def finished(self, job: Job, status: str, message: str = "") -> None:
        pass

    def heartbeat(self, jobs: Sequence[Job]) -> None:
        pass

    def held(self, job: Job, code: str, reason: str) -> None:
        pass


class StoreQueue:
    """The database's queue (`rankpack submit`), claimed with leases."""

    def __init__(self, store: Store, multiplex_id: int | None) -> None:
        self.store = store
        self.multiplex_id = multiplex_id

    def pending(self) -> list[Job]:
        return [Job(q.id, Submission.from_json(q.options)) for q in self.store.queue()]

    def claim(self, job: Job) -> bool:
        return self.store.claim(job.queue_id, self.multiplex_id)

    def started(self, job: Job, run_id: int, sim_id: str, staged: StagedCase) -> None:
        self.store.set_queue_run(job.queue_id, run_id)

    def finished(self, job: Job, status: str, message: str = "") -> None:
        self.store.finish_queue(job.queue_id, status)

    def heartbeat(self, jobs: Sequence[Job]) -> None:
        self.store.heartbeat([j.queue_id for j in jobs])

    def held(self, job: Job, code: str, reason: str) -> None:
        pass  # the launch-held event says it (`rankpack events`)


@dataclass(frozen=True)
class Adopted:
    """A simulation launched by an earlier controller process, as its job source recorded
    it: what `ControlLoop.adopt` needs to follow it again."""

    job: Job
    sim_id: str
    run_id: int | None
    staged: StagedCase
    elapsed_s: float
    """Seconds since it was launched."""


# -- settings, views and results ----------------------------------------------------------


@dataclass(frozen=True)
class LoopSettings:
    runs_root: Path
    """Run directories are created below this."""
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    tick_s: float = 1.0
    shim: bool = True
    wait_mode: str = "spin"
    """spin, polite, adaptive (fixed for every simulation), or auto: the wait rule
    (`rankpack.controller.waits`) chooses at launch and switches it live."""
    mpi: str = "openmpi"
    capacity_millis: int | None = None
    """The budget of all requests together; default: the backend's allocatable CPU."""
    label: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Stored with every run's options (e.g. the multiplex session it belongs to)."""
    multiplex_id: int | None = None
    """Events and runs of a multiplex session carry its id."""
    image: str | None = None
    volume: str | None = None
    leave_running: bool = False
    """When the loop is stopped, leave launched simulations running for a later controller
    to adopt (the operator) instead of stopping them (`rankpack run`, `multiplex`)."""
    solvers: frozenset[str] | None = None
    """Applications a simulation may run (the operator's allowlist): a case whose
    application is not one of them fails at launch, before any rank pod exists (None: any)."""
    prestage: bool = True
    """While simulations run, stage the head of the queue ahead of its launch (copy, mesh,
    decompose), so that when it is launched - at once, or after the running ones end - it
    starts without a staging gap. Its copy is removed if it is never launched."""


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
class StageFailure:
    queue_id: int
    case: str
    reason: str


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


class _Capacity(NamedTuple):
    capacity_millis: int
    others_millis: int
    nodes: tuple[NodeCores, ...]
    bound: str
    """What binds the capacity when it is not the nodes (a ResourceQuota), else ''."""


# -- one simulation as the loop holds it --------------------------------------------------


@dataclass
class _Sim:
    job: Job
    sim_id: str
    plan: Plan
    queued_s: float
    staged: StagedCase | None = None
    run_id: int | None = None
    started_s: float = 0.0
    t0: float = 0.0
    """Backend clock at launch."""
    end_t: float | None = None
    parser: LogParser = field(default_factory=LogParser)
    last: SimObservation | None = None
    times: list[float] = field(default_factory=list)
    usages: list[list[int]] = field(default_factory=list)
    pending_samples: list[SampleRow] = field(default_factory=list)
    resizes: list[ResizeRecord] = field(default_factory=list)
    inflight: dict[int, tuple[float, int, int, str, str]] = field(default_factory=dict)
    """rank -> (t_s, from, to, kind, reason) of a resize not settled yet."""
    asked: dict[int, int] = field(default_factory=dict)
    """rank -> the request last asked for and not refused (newer than ``last`` when it was
    asked after the last observation)."""
    restarts: dict[int, int] = field(default_factory=dict)
    duty_marks: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    """rank -> [(iterations, compute_ns, mpi_ns)], for the steady-state duty."""
    cores: tuple[float, ...] = ()
    wait_mode: WaitMode | None = None
    """The wait mode its ranks were last set to (launch mode, then live switches); None
    without the shim."""
    idle_yield: bool = False
    """The MPI library's own idle yield, as the wait rule gave it at launch."""
    waits: list[WaitRecord] = field(default_factory=list)
    """Each mode its ranks got, when, and why (per rank): its result's ``wait_modes``."""
    learned_duty: tuple[float, ...] = ()
    """Duty cycles of the earlier run its sizes were learned from (see `learned`)."""
    deferred: dict[int, str] = field(default_factory=dict)
    """rank -> why its in-flight resize is deferred (recorded once per resize)."""
    shared_s: float | None = 0.0
    """Seconds it ran beside another launched simulation of this loop, to the tick (None:
    unknown, adopted from an earlier controller); recorded with its result."""

    @property
    def launched(self) -> bool:
        return self.run_id is not None


class ControlLoop:
    def __init__(
        self,
        backend: Backend,
        store: Store,
        jobs: JobSource,
        settings: LoopSettings,
        *,
        display: Display | None = None,
        stop: threading.Event | None = None,
        t0: float | None = None,
    ) -> None:
        self.backend = backend
        self.store = store
        self.jobs = jobs
        self.settings = settings
        self.display = display or NullDisplay()
        self.stop = stop or threading.Event()
        self.t0 = backend.clock() if t0 is None else t0
        """Backend clock at the session's start: events' ``t_s`` count from here (a
        caller running several loops in one session passes the same t0 to each)."""
        self.state = ControllerState()
        self.sims: dict[str, _Sim] = {}
        self.results: list[RunResult] = []
        self.outcomes: list[SimOutcome] = []
        self.stage_failures: list[StageFailure] = []
        self.resizes = 0
        self.rejected = 0
        self.restarts = 0
        self.max_seen = 0
        self.held: dict[tuple[str, int], Resize] = {}
        """Increases waiting for the decreases in flight to settle (see `_apply_all`)."""
        self.held_noted: set[tuple[str, int]] = set()
        """Held increases a ``resize-held`` event has been recorded for."""
        self.learned: dict[str, LearnedSizes | None] = {}
        """Learned sizes per submission (JSON key), until a run ends (new knowledge)."""
        self.wait_failed: set[tuple[str, str]] = set()
        """(sim, mode) switches refused once (recorded once; asked for again every tick)."""
        self.retries: dict[tuple[str, int], tuple[Resize, float]] = {}
        """Failed resizes asked for again at a time (`now`), with back-off (see `_retry`)."""
        self.attempts: dict[tuple[str, int], int] = {}
        """Retries so far of the resize in flight per (sim, rank) (0: the first request)."""
        self.prestaged: dict[int, str] = {}
        """queue id -> sim id of a case staged ahead of its launch (see `_prestage`)."""
        self.running_since: tuple[float, frozenset[str]] = (0.0, frozenset())
        """(time, launched simulations still running) at the end of the last tick: what
        `_count_shared` charges the time since to."""

    def now(self) -> float:
        return self.backend.clock() - self.t0

    def event(self, run_id: int | None, name: str, **detail: Any) -> None:
        self.store.add_event(
            run_id, name, detail, multiplex_id=self.settings.multiplex_id, t_s=round(self.now(), 3)
        )

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> LoopResult:
        status = "completed"
        try:
            while True:
                self._count_shared()
                self._observe_all()
                self._retry_due()
                self._release_held()
                pending = self.jobs.pending()
                if not pending and not self.sims:
                    break
                obs = self._observations(pending)
                decision = decide(obs, self.state, self.settings.controller)
                self.state = decision.state
                self._apply_all(decision.actions, pending)
                self._prestage(pending)
                self.running_since = (self.now(), self._running())
                self.max_seen = max(self.max_seen, len(self.sims))
                self.jobs.heartbeat([s.job for s in self.sims.values()])
                self.display.update(obs.now_s, self._views())
                if self.stop.is_set():
                    status = "interrupted"
                    break
                self.backend.wait(self.settings.tick_s)
                if self.stop.is_set():
                    status = "interrupted"
                    break
        except KeyboardInterrupt:
            status = "interrupted"
        finally:
            self._prestage([])  # never launched: their copies hold no results
            for sim in list(self.sims.values()):
                if self.settings.leave_running and sim.launched and sim.end_t is None:
                    self._flush(sim)  # it runs on; the next controller adopts it
                    self.sims.pop(sim.sim_id, None)
                elif self.settings.leave_running and sim.launched:
                    self._end(sim)  # it ended by itself: recorded as it ended
                else:
                    self._end(sim, interrupted="stopped by the user (Ctrl-C or SIGTERM)")
            self.display.close()
        return LoopResult(
            status=status,
            results=tuple(self.results),
            outcomes=tuple(sorted(self.outcomes, key=lambda o: o.started_s)),
            stage_failures=tuple(self.stage_failures),
            resizes=self.resizes,
            resizes_rejected=self.rejected,
            restarts=self.restarts,
            max_concurrent_seen=self.max_seen,
        )

    # -- observing -------------------------------------------------------------------------

    def _running(self) -> frozenset[str]:
        return frozenset(i for i, sim in self.sims.items() if sim.launched and sim.end_t is None)

    def _count_shared(self) -> None:
        """Charge the time since the last tick to every simulation that was running then
        beside another one (before any of them is ended and recorded this tick). A change
        between ticks counts as shared for the whole tick: an overestimate of at most one
        tick, so a run recorded as alone (0 s) never overlapped another launched one."""
        since, running = self.running_since
        if len(running) < 2:
            return
        dt = max(0.0, self.now() - since)
        for sim_id in running:
            sim = self.sims.get(sim_id)
            if sim is not None and sim.shared_s is not None:
                sim.shared_s += dt

    def _observe_all(self) -> None:
        for sim in list(self.sims.values()):
            obs = self.backend.observe(sim.sim_id)
            if not sim.launched:
                self._staging_progress(sim, obs)
                continue
            self._record(sim, obs)
            if obs.phase.ended:
                self._end(sim)

    def _staging_progress(self, sim: _Sim, obs: SimObservation) -> None:
        if obs.phase is SimPhase.STAGED and obs.staged is not None:
            self._launch_staged(sim, obs.staged)
        elif obs.phase is SimPhase.FAILED:
            reason = obs.stage_error or obs.reason or "staging failed"
            self.backend.release(sim.sim_id)
            del self.sims[sim.sim_id]
            self.stage_failures.append(
                StageFailure(sim.job.queue_id, sim.job.submission.case, reason)
            )
            self.jobs.finished(sim.job, "failed")
            self.event(None, "launch-failed", queue_id=sim.job.queue_id, reason=reason)

    def _record(self, sim: _Sim, obs: SimObservation) -> None:
        if obs.log_text:
            sim.parser.feed(obs.log_text)
        iterations = sim.parser.state.iterations
        t = obs.t_s - sim.t0
        cores: list[float] = []
        for r in obs.ranks:
            series = sim.usages[r.rank]
            if series and sim.times and t > sim.times[-1]:
                cores.append((r.usage_ns - series[-1]) / 1e9 / (t - sim.times[-1]))
            else:
                cores.append(0.0)
            series.append(r.usage_ns)
            sim.pending_samples.append(
                SampleRow(
                    t,
                    r.rank,
                    r.usage_ns,
                    r.request_millis,
                    r.nr_throttled,
                    iterations,
                    r.compute_ns,
                    r.mpi_ns,
                )
            )
            if r.compute_ns is not None and r.mpi_ns is not None:
                sim.duty_marks.setdefault(r.rank, []).append((iterations, r.compute_ns, r.mpi_ns))
            if r.restarts > sim.restarts.get(r.rank, 0):
                self.restarts += r.restarts - sim.restarts.get(r.rank, 0)
                self.event(sim.run_id, "restart", rank=r.rank, restarts=r.restarts)
                sim.restarts[r.rank] = r.restarts
            if r.rank in sim.inflight and r.resize is not None:
                self._follow_resize(
                    sim, r.rank, r.resize.state, r.resize.latency_s, r.resize.reason
                )
        sim.times.append(t)
        sim.cores = tuple(cores)
        sim.last = obs
        if len(sim.pending_samples) >= 8 * len(sim.usages):
            self._flush(sim)
        if obs.phase.ended and sim.end_t is None:
            sim.end_t = obs.t_s

    def _flush(self, sim: _Sim) -> None:
        if sim.run_id is not None and sim.pending_samples:
            self.store.add_samples(sim.run_id, sim.pending_samples)
            self.store.update_progress(sim.run_id, sim.parser.state.iterations)
        sim.pending_samples = []

    # -- the policy's view -----------------------------------------------------------------

    def _capacity(self) -> int:
        return self._capacity_and_others().capacity_millis

    def _capacity_and_others(self) -> _Capacity:
        """The capacity left to this loop, what others request, the nodes as the wait rule
        sees them, and the namespace's quota when it is what binds."""
        inventory = self.backend.inventory()
        ours = sum(
            sum(r.request_millis for r in s.last.ranks) if s.last else s.plan.total_millis
            for s in self.sims.values()
            if s.launched
        )
        others = max(0, sum(n.requested_millis for n in inventory.nodes) - ours)
        base = self.settings.capacity_millis or inventory.allocatable_millis
        placed: dict[str | None, int] = {}
        for s in self.sims.values():
            for r in s.last.ranks if s.launched and s.last else ():
                placed[r.node] = placed.get(r.node, 0) + 1
        nodes = tuple(
            NodeCores(n.name, n.allocatable_millis, max(0, n.rank_pods - placed.get(n.name, 0)))
            for n in inventory.nodes
        )
        if len(nodes) == 1 and self.settings.capacity_millis:
            # one node, capped for this loop (--allocatable): the cap is its cores
            nodes = (replace(nodes[0], allocatable_millis=min(base, nodes[0].allocatable_millis)),)
        capacity = max(0, min(base, inventory.allocatable_millis - others))
        bound = ""
        quota = inventory.quota
        if quota is not None:
            # the namespace may request hard - (what its other pods request) more: Kubernetes
            # refuses a pod or a resize past it, so plan within it instead
            allowed = max(0, quota.hard_millis - max(0, quota.used_millis - ours))
            if allowed < capacity:
                capacity = allowed
                bound = (
                    f"the namespace's ResourceQuota {quota.name} (requests.cpu"
                    f" {quota.hard_millis}m, {quota.used_millis}m used)"
                )
        return _Capacity(capacity, others, nodes, bound)

    def _observations(self, pending: list[Job]) -> Observations:
        sims = []
        for sim in self.sims.values():
            sub = sim.job.submission
            if sim.last is None:
                ranks = tuple(
                    RankSnapshot(r.rank, r.cpu_millis, 0, None, None) for r in sim.plan.ranks
                )
                sims.append(
                    SimSnapshot(
                        sim_id=sim.sim_id,
                        started_s=sim.queued_s,
                        iterations=0,
                        expected_iterations=sim.staged.expected_iterations if sim.staged else 0,
                        budget_millis=sub.budget_millis,
                        ranks=ranks,
                        phases=sub.phases,
                        sizing=sub.sizing,
                        starting=True,
                        learned_duty=sim.learned_duty,
                        wait=self._wait_setting(sub),
                    )
                )
                continue
            assert sim.staged is not None
            sims.append(
                SimSnapshot(
                    sim_id=sim.sim_id,
                    started_s=sim.started_s,
                    iterations=sim.parser.state.iterations,
                    expected_iterations=sim.staged.expected_iterations,
                    budget_millis=sub.budget_millis,
                    ranks=tuple(
                        RankSnapshot(
                            rank=r.rank,
                            request_millis=r.request_millis,
                            usage_ns=r.usage_ns,
                            compute_ns=r.compute_ns,
                            mpi_ns=r.mpi_ns,
                            node=r.node,
                        )
                        for r in sim.last.ranks
                    ),
                    phases=sub.phases,
                    sizing=sub.sizing,
                    starting=sim.last.phase is SimPhase.PENDING,
                    learned_duty=sim.learned_duty,
                    wait=self._wait_setting(sub),
                    wait_mode=sim.wait_mode,
                )
            )
        queued = []
        for j in pending:
            found = self._learned(j.submission)
            initial = found.request_millis if found else j.submission.initial_millis
            queued.append(QueuedSim(j.queue_id, j.submission.n_ranks, initial,
                                    found.duty if found else ()))  # fmt: skip
        cap = self._capacity_and_others()
        return Observations(
            now_s=self.now(),
            capacity_millis=cap.capacity_millis,
            sims=tuple(sims),
            queue=tuple(queued),
            others_millis=cap.others_millis,
            nodes=cap.nodes,
            capacity_bound=cap.bound,
        )

    # -- learned sizes ------------------------------------------------------------------------

    def _learned(self, sub: Submission) -> LearnedSizes | None:
        key = json.dumps(sub.to_json(), sort_keys=True)
        if key not in self.learned:
            c = self.settings.controller
            self.learned[key] = learned_sizes(
                self.store, sub, self.backend.name, headroom=c.headroom,
                floor_millis=c.floor_millis,
            )  # fmt: skip
        return self.learned[key] or self._running_copy(sub, key)

    def _running_copy(self, sub: Submission, key: str) -> LearnedSizes | None:
        """The sizes of a running copy of ``sub`` (same submission) that the policy has
        sized: copies queued together fit at once, before any of them has completed."""
        if not learnable(sub):
            return None
        for sim in self.sims.values():
            mem = self.state.sims.get(sim.sim_id)
            if (
                sim.last is None
                or sim.run_id is None
                or mem is None
                or mem.stage != "sized"
                or len(mem.duty) != sub.n_ranks
                or len(sim.last.ranks) != sub.n_ranks
                or json.dumps(sim.job.submission.to_json(), sort_keys=True) != key
            ):
                continue
            millis = tuple(sim.asked.get(r.rank, r.desired.request_millis) for r in sim.last.ranks)
            return LearnedSizes(sim.run_id, millis, "running", tuple(mem.duty))
        return None

    def _plan(self, sub: Submission) -> tuple[Plan, LearnedSizes | None]:
        """The submission's plan, its requests replaced by learned ones when there are any
        (the total stays the budget: it keys the single-run baselines)."""
        plan = sub.plan()
        found = self._learned(sub)
        if found is None or len(found.request_millis) != plan.n_ranks:
            return plan, None
        ranks = tuple(
            replace(r, cpu_millis=m) for r, m in zip(plan.ranks, found.request_millis, strict=True)
        )
        return replace(plan, ranks=ranks), found

    def _wait_setting(self, sub: Submission | None = None) -> WaitSetting:
        """The simulation's own wait mode (its submission's), else the session's."""
        mode = (sub.wait if sub is not None else None) or self.settings.wait_mode
        if mode not in WAIT_SETTINGS:
            raise UserError(f"unknown wait mode '{mode}'; use {', '.join(WAIT_SETTINGS)}")
        return mode

    def _wait_at_launch(self, sim: _Sim) -> None:
        """The wait rule for a simulation about to start beside the others of this loop
        (`waits.at_launch`): its ranks' mode, and the MPI library's idle yield to match."""
        obs = self._observations([])
        obs = replace(obs, sims=tuple(s for s in obs.sims if s.sim_id != sim.sim_id))
        requests = tuple(r.cpu_millis for r in sim.plan.ranks)
        choice = waits.at_launch(obs, self._wait_setting(sim.job.submission), requests)
        sim.idle_yield = choice.idle_yield
        sim.wait_mode = choice.mode if self.settings.shim else None
        sim.waits.append(WaitRecord(round(self.now(), 3), choice.mode, choice.reason, choice.ranks))

    # -- actions ---------------------------------------------------------------------------

    def _apply_all(self, actions: Sequence[Action], pending: list[Job]) -> None:
        """Carry out one decision's actions: decreases, then the others (a launch after the
        decreases that made room for it), then increases.

        A node admits resizes one at a time against what is allocated *now*, so trading CPU
        between ranks (one shrinks, another grows, the total fits) can see the increase
        refused (kubelet: Deferred, "OutOfcpu") while the decrease is still in flight, and a
        deferred resize is only tried again much later (~13 s measured on the dev cluster).
        So every decrease is sent first and an increase is held while any decrease is in
        flight; held increases go out as soon as none is (`_release_held`, every tick).
        """
        resizes = [a for a in actions if isinstance(a, Resize)]
        grows = []
        for action in resizes:
            self.held.pop((action.sim_id, action.rank), None)  # superseded
            self.held_noted.discard((action.sim_id, action.rank))
            self.retries.pop((action.sim_id, action.rank), None)
            self.attempts.pop((action.sim_id, action.rank), None)
            if self._change(action) < 0:
                self._resize(action)
            else:
                grows.append(action)
        # Then launches (after the decreases that made room for them), wait modes, notes.
        for other in actions:
            if not isinstance(other, Resize):
                self._apply(other, pending)
        for action in grows:
            self.held[(action.sim_id, action.rank)] = action
        self._release_held()

    def _change(self, action: Resize) -> int:
        """The resize's change of request (millicores); 0 when the simulation is gone."""
        sim = self.sims.get(action.sim_id)
        if sim is None or sim.last is None or action.rank >= len(sim.last.ranks):
            return 0
        return action.request_millis - sim.last.ranks[action.rank].desired.request_millis

    def _release_held(self) -> None:
        if not self.held:
            return
        shrinking = sum(
            1 for sim in self.sims.values() for f in sim.inflight.values() if f[2] < f[1]
        )
        if shrinking:
            for key in self.held.keys() - self.held_noted:
                action = self.held[key]
                sim = self.sims.get(action.sim_id)
                self.event(sim.run_id if sim else None, "resize-held", rank=action.rank,
                           request_millis=action.request_millis,
                           reason=f"{shrinking} decrease(s) in flight settle first")  # fmt: skip
                self.held_noted.add(key)
            return
        held, self.held = self.held, {}
        self.held_noted.clear()
        for action in held.values():
            if action.sim_id in self.sims:
                self._resize(action)

    def _apply(self, action: Action, pending: list[Job]) -> None:
        if isinstance(action, Resize):
            self._resize(action)
        elif isinstance(action, Launch):
            job = next((j for j in pending if j.queue_id == action.queue_id), None)
            if job is not None:
                self._stage(job, action.reason, action.request_millis)
        elif isinstance(action, SetWaitMode):
            self._set_wait_mode(action)
        elif isinstance(action, Note):
            sim = self.sims.get(action.sim_id) if action.sim_id else None
            coded = {"code": action.code} if action.code else {}
            self.event(sim.run_id if sim else None, action.kind, reason=action.reason, **coded)
            held = next((j for j in pending if j.queue_id == action.queue_id), None)
            if held is not None and action.kind == "launch-held":
                self.jobs.held(held, action.code, action.reason)

    def _set_wait_mode(self, action: SetWaitMode) -> None:
        sim = self.sims.get(action.sim_id)
        if sim is None or not sim.launched or sim.wait_mode == action.mode:
            return  # (the same mode: it was launched in it; the policy's memory now agrees)
        try:
            self.backend.set_wait_mode(sim.sim_id, action.mode)
        except BackendError as exc:
            # Nothing changed on the ranks: forget the decision, so the policy asks again
            # on the next tick (e.g. a rank had not published its record yet).
            mem = self.state.sims.get(sim.sim_id)
            if mem is not None:
                sims = {**self.state.sims, sim.sim_id: replace(mem, wait_mode=sim.wait_mode)}
                self.state = replace(self.state, sims=sims)
            if (sim.sim_id, action.mode) not in self.wait_failed:
                self.wait_failed.add((sim.sim_id, action.mode))
                why = f"{action.reason}; refused: {exc} (asked again next tick)"
                self.event(sim.run_id, "wait-mode-failed", mode=action.mode, reason=why)
            return
        previous = sim.wait_mode
        sim.wait_mode = action.mode
        sim.waits.append(WaitRecord(round(self.now(), 3), action.mode, action.reason, action.ranks))
        self.wait_failed.discard((sim.sim_id, action.mode))
        self.event(sim.run_id, "wait-mode", mode=action.mode, previous=previous,
                   reason=action.reason)  # fmt: skip

    def _stage(self, job: Job, reason: str, request_millis: tuple[int, ...] = ()) -> None:
        if not self.jobs.claim(job):
            self.event(None, "launch-skipped", queue_id=job.queue_id,
                       reason="another session claimed it first")  # fmt: skip
            return
        sub = job.submission
        ahead = self.prestaged.pop(job.queue_id, None)
        sim_id = ahead or self._start_staging(job)
        if sim_id is None:
            return
        plan, found = self._plan(sub)
        if len(request_millis) == plan.n_ranks:
            ranks = tuple(
                replace(r, cpu_millis=m) for r, m in zip(plan.ranks, request_millis, strict=True)
            )
            plan = replace(plan, ranks=ranks)
        self.sims[sim_id] = _Sim(job=job, sim_id=sim_id, plan=plan, queued_s=self.now(),
                                 learned_duty=found.duty if found else ())  # fmt: skip
        self.event(None, "stage", queue_id=job.queue_id, case=sub.case, sim=sim_id, reason=reason,
                   **({"staged_ahead": True} if ahead else {}))  # fmt: skip
        if found is not None:
            self.event(None, "learned-sizes", queue_id=job.queue_id, sim=sim_id,
                       from_run=found.run_id, source=found.source,
                       request_millis=list(found.request_millis),
                       reason=found.describe())  # fmt: skip
        if ahead:  # staged already (or still staging): launch now, not at the next tick
            self._staging_progress(self.sims[sim_id], self.backend.observe(sim_id))

    def _start_staging(self, job: Job, failures_are_final: bool = True) -> str | None:
        """Ask the backend to stage ``job``'s case; its sim id, or None if it was refused
        (recorded as the job's failure when ``failures_are_final``)."""
        sub = job.submission
        sim_id = f"s{uuid.uuid4().hex[:10]}"
        spec = StageSpec(
            sim_id=sim_id,
            case=sub.case,
            n_ranks=sub.n_ranks,
            runs_root=self.settings.runs_root,
            iterations=sub.iterations,
            decompose=sub.decompose,
            decompose_weights=sub.decompose_weights or sub.weights,
            center=sub.center,
            workdir=Path(sub.workdir) if sub.workdir else None,
        )
        try:
            self.backend.stage(spec)
        except (UserError, BackendError) as exc:
            if failures_are_final:
                self.stage_failures.append(StageFailure(job.queue_id, sub.case, str(exc)))
                self.jobs.finished(job, "failed", str(exc))
                self.event(None, "launch-failed", queue_id=job.queue_id, reason=str(exc))
            return None
        return sim_id

    def _prestage(self, pending: list[Job]) -> None:
        """Stage the queue's head ahead while simulations run (`LoopSettings.prestage`);
        release what was staged ahead for jobs no longer at the head (cancelled, claimed
        by another controller) or when the loop ends (``pending`` empty). ``pending`` is
        the tick's queue: the jobs this tick staged or failed are not its head."""
        taken = {s.job.queue_id for s in self.sims.values()}
        taken |= {f.queue_id for f in self.stage_failures}
        waiting = [j for j in pending if j.queue_id not in taken]
        head = waiting[0].queue_id if waiting and self.sims and self.settings.prestage else None
        for qid in [q for q in self.prestaged if q != head]:
            with contextlib.suppress(BackendError):
                self.backend.release(self.prestaged.pop(qid))
        if head is None or head in self.prestaged:
            return
        sim_id = self._start_staging(waiting[0], failures_are_final=False)
        if sim_id is not None:  # a refusal is met again, and recorded, at its launch
            self.prestaged[head] = sim_id

    def _launch_staged(self, sim: _Sim, staged: StagedCase) -> None:
        sub = sim.job.submission
        if sub.solver and sub.solver != staged.solver:
            self.event(None, "solver", sim=sim.sim_id, queue_id=sim.job.queue_id,
                       reason=f"{sub.solver} as submitted instead of the case's application "
                       f"{staged.solver}")  # fmt: skip
            staged = replace(staged, solver=sub.solver)
        sim.staged = staged
        for warning in staged.warnings:
            self.event(None, "warning", sim=sim.sim_id, reason=warning)
        if self.settings.controller.launch_must_fit:
            self._fit_launch(sim)
        sim.run_id = self._new_run(sim, staged)
        self.jobs.started(sim.job, sim.run_id, sim.sim_id, staged)
        sim.usages = [[] for _ in sim.plan.ranks]
        # Under auto, the wait rule counts its ranks with those already on the node(s):
        # spinning until the policy could switch it (its records publish ~1 s after launch)
        # would cost the others, and ranks that outnumber cores slow each other down.
        self._wait_at_launch(sim)
        spec = self._spec(sim)
        sim.t0 = self.backend.clock()
        sim.started_s = self.now()
        try:
            allowed = self.settings.solvers
            if allowed is not None and staged.solver not in allowed:
                raise UserError(
                    f"{staged.solver!r} (the case's application) is not an allowed solver; "
                    "ask the admin to allow it (rankpack operator --solver)"
                )
            self.backend.launch(spec)
        except (BackendError, UserError) as exc:
            sim.end_t = sim.t0
            self._end(sim, failure=f"launch failed: {exc}")
            return
        # Every rank's counter is 0 at launch: the CPU-seconds integral starts there, so
        # start-up before the first sample is counted (short runs are mostly start-up).
        sim.times.append(0.0)
        for series in sim.usages:
            series.append(0)
        self.event(
            sim.run_id, "launch", queue_id=sim.job.queue_id, case=sub.case, sim=sim.sim_id,
            request_millis=[r.cpu_millis for r in sim.plan.ranks],
        )  # fmt: skip

    def _fit_launch(self, sim: _Sim) -> None:
        """Scale the initial requests down to the unrequested capacity (Kubernetes: rank
        pods that do not fit are never scheduled); the plan's total, the budget, stays."""
        ours = sum(
            sum(r.request_millis for r in s.last.ranks) if s.last else s.plan.total_millis
            for s in self.sims.values()
            if s.launched and s is not sim
        )
        free = self._capacity() - ours
        wanted = [r.cpu_millis for r in sim.plan.ranks]
        floor = self.settings.controller.floor_millis
        if sum(wanted) <= free or free < floor * len(wanted):
            return
        fitted = proportional_millis([float(w) for w in wanted], free, floor)
        ranks = tuple(replace(r, cpu_millis=m) for r, m in zip(sim.plan.ranks, fitted, strict=True))
        sim.plan = replace(sim.plan, ranks=ranks)
        self.event(None, "launch-fitted", queue_id=sim.job.queue_id, sim=sim.sim_id,
                   request_millis=fitted,
                   reason=f"requests {sum(wanted)}m scaled to the {free}m unrequested "
                   "so that every rank pod fits")  # fmt: skip

    def _new_run(self, sim: _Sim, staged: StagedCase) -> int:
        sub, s = sim.job.submission, self.settings
        options = {
            **sub.to_json(),
            "label": s.label,
            "shim": s.shim,
            "wait_mode": self._wait_setting(sub),
            "sim_id": sim.sim_id,
            "queue_id": sim.job.queue_id,
            **s.extra,
        }
        return self.store.create_run(
            NewRun(
                case_name=staged.case_name,
                case_source=staged.case_source,
                run_dir=str(staged.run_dir),
                solver=staged.solver,
                n_ranks=sub.n_ranks,
                qos=sim.plan.qos.value,
                total_millis=sim.plan.total_millis,
                decompose=sub.decompose,
                backend=self.backend.name,
                placement=self.backend.placement(),
                expected_iterations=staged.expected_iterations,
                options=options,
            ),
            [
                RankRow(
                    r.rank, r.weight, r.cpu_millis, r.limit_millis, staged.cells_per_rank[r.rank]
                )
                for r in sim.plan.ranks
            ],
        )

    def _spec(self, sim: _Sim) -> SimSpec:
        assert sim.staged is not None
        s, staged = self.settings, sim.staged
        return SimSpec(
            sim_id=sim.sim_id,
            case_dir=staged.run_dir,
            command=(staged.solver, "-parallel"),
            ranks=tuple(RankResources(r.cpu_millis, r.limit_millis) for r in sim.plan.ranks),
            log_path=staged.log_path,
            env={**rank_env(), **waits.mpi_idle_env(sim.idle_yield)},
            mpi=s.mpi,
            shim=(ShimSpec(sim.wait_mode or "spin", s.mpi) if s.shim else None),
            image=s.image,
            volume=sim.job.submission.volume or s.volume,
            labels={"rankpack.dev/run-id": str(sim.run_id)},
        )

    def adopt(self, adopted: Adopted) -> None:
        """Take over a simulation an earlier controller process launched (its job source
        knows it as running): the backend follows it again, and it ends as if launched here.

        The controller's memory of it starts afresh (warm-up, then profiling), so it may be
        sized again; resizes recorded before are kept, none is counted twice. Raises
        BackendError (e.g. UnknownSimulation) if the backend no longer holds it.
        """
        job, staged = adopted.job, adopted.staged
        sim = _Sim(job=job, sim_id=adopted.sim_id, plan=job.submission.plan(), queued_s=0.0)
        sim.staged = staged
        if adopted.run_id is not None and self.store.take_over_run(adopted.run_id):
            sim.run_id = adopted.run_id
            # resizes settled before are the run's: counted once, never again
            sim.resizes = list(self.store.get_run(sim.run_id).resizes)
        else:
            sim.run_id = self._new_run(sim, staged)
            self.jobs.started(job, sim.run_id, sim.sim_id, staged)
        sim.usages = [[] for _ in sim.plan.ranks]
        # What the earlier process last chose is not known: set what the rule gives now, so
        # what the ranks do is known; the policy switches it from there.
        self._wait_at_launch(sim)
        self.backend.adopt(sim.sim_id, self._spec(sim))
        if sim.wait_mode is not None:
            try:
                self.backend.set_wait_mode(sim.sim_id, sim.wait_mode)
            except BackendError as exc:
                self.event(sim.run_id, "wait-mode-failed", mode=sim.wait_mode,
                           reason=f"adopted: {exc}")  # fmt: skip
        sim.t0 = self.backend.clock() - adopted.elapsed_s
        sim.started_s = self.now() - adopted.elapsed_s
        sim.shared_s = None  # what it shared under the earlier controller is not known
        self.sims[sim.sim_id] = sim
        self.event(sim.run_id, "adopted", queue_id=job.queue_id, sim=sim.sim_id,
                   reason=f"launched by an earlier controller {adopted.elapsed_s:.0f} s ago; "
                   "followed again")  # fmt: skip

    def _resize(self, action: Resize) -> None:
        sim = self.sims.get(action.sim_id)
        if sim is None or not sim.launched or sim.last is None:
            return
        rank = action.rank
        old = sim.last.ranks[rank].desired
        t_s = self.backend.clock() - sim.t0
        new = RankResources(action.request_millis, old.limit_millis)
        try:
            status = self.backend.resize(sim.sim_id, rank, new)
            state, latency, why = status.state, status.latency_s, status.reason
        except BackendError as exc:
            state, latency, why = ResizeState.REJECTED, None, str(exc)
        sim.inflight[rank] = (t_s, old.request_millis, action.request_millis, action.kind,
                              action.reason)  # fmt: skip
        sim.asked[rank] = action.request_millis
        self._follow_resize(sim, rank, state, latency, why)
        if rank in sim.inflight:
            self.event(sim.run_id, "resize-requested", rank=rank, kind=action.kind,
                       request_millis=action.request_millis, reason=action.reason)  # fmt: skip

    def _follow_resize(
        self,
        sim: _Sim,
        rank: int,
        state: ResizeState,
        latency_s: float | None,
        why: str,
        *,
        ended: bool = False,
    ) -> None:
        """Settle an in-flight resize once its state is final (or the run ``ended``).

        Deferred (the node cannot grant it now; the kubelet keeps it and tries again) is
        not final: it is recorded once as ``resize-deferred`` and followed on; it counts
        only if it completes. A FAILED resize (not applied: e.g. the apiserver did not
        answer) is asked for again with back-off (`_retry`); refusals are not.
        """
        if state is ResizeState.DEFERRED and not ended:
            if rank not in sim.deferred and rank in sim.inflight:
                sim.deferred[rank] = why
                self.event(sim.run_id, "resize-deferred", rank=rank,
                           request_millis=sim.inflight[rank][2],
                           reason=f"{why or 'deferred by the node'}; the node tries it again, "
                           "counted once it completes")  # fmt: skip
            return
        if not state.final and not ended:
            return
        if ended and rank in sim.deferred:
            state, why = (
                ResizeState.DEFERRED,
                f"still deferred when the run ended ({sim.deferred[rank]})",
            )
        sim.deferred.pop(rank, None)
        t_s, old, new, kind, reason = sim.inflight.pop(rank)
        outcome = str(state) if state is not ResizeState.COMPLETED else "completed"
        record = ResizeRecord(
            rank=rank, t_s=round(t_s, 3), from_millis=old, to_millis=new, status=outcome,  # type: ignore[arg-type]
            latency_s=latency_s, reason=reason if state is ResizeState.COMPLETED else why,
            kind=kind,
        )  # fmt: skip
        sim.resizes.append(record)
        assert sim.run_id is not None
        self.store.add_resize(sim.run_id, record)
        if state is ResizeState.COMPLETED:
            self.resizes += 1
            self.event(sim.run_id, "resize", kind=kind, rank=rank, request_millis=new,
                       reason=reason, latency_s=latency_s)  # fmt: skip
        else:
            # The rank keeps running with its old request; the policy sees that next tick.
            sim.asked.pop(rank, None)
            self.rejected += 1
            self.event(sim.run_id, f"resize-{outcome}", rank=rank, request_millis=new,
                       reason=why, final=True)  # fmt: skip
            if state is ResizeState.FAILED and not ended:
                self._retry(sim, Resize(sim.sim_id, rank, new, reason, kind), why)  # type: ignore[arg-type]
        if state is ResizeState.COMPLETED or ended:
            self.attempts.pop((sim.sim_id, rank), None)

    RETRY_DELAYS_S = (2.0, 4.0, 8.0, 16.0, 30.0)
    """Back-off of a failed resize's retries; after the last one it is given up."""

    def _retry(self, sim: _Sim, action: Resize, why: str) -> None:
        key = (sim.sim_id, action.rank)
        attempt = self.attempts.get(key, 0)
        if attempt >= len(self.RETRY_DELAYS_S):
            self.attempts.pop(key, None)
            self.event(sim.run_id, "resize-given-up", rank=action.rank,
                       request_millis=action.request_millis,
                       reason=f"failed {attempt + 1} times; last: {why}")  # fmt: skip
            return
        delay = self.RETRY_DELAYS_S[attempt]
        self.attempts[key] = attempt + 1
        self.retries[key] = (action, self.now() + delay)
        self.event(sim.run_id, "resize-retry", rank=action.rank,
                   request_millis=action.request_millis, attempt=attempt + 1,
                   delay_s=delay, reason=f"asked again in {delay:g} s: {why}")  # fmt: skip

    def _retry_due(self) -> None:
        now = self.now()
        for key, (action, due) in list(self.retries.items()):
            if due > now:
                continue
            del self.retries[key]
            if action.sim_id not in self.sims:
                self.attempts.pop(key, None)
                continue
            if self._change(action) < 0:
                self._resize(action)
            else:
                self.held[key] = action  # an increase waits for decreases in flight

    # -- the end of a simulation ------------------------------------------------------------

    def _end(
        self, sim: _Sim, *, interrupted: str | None = None, failure: str | None = None
    ) -> None:
        if not sim.launched:
            self.backend.release(sim.sim_id)
            self.sims.pop(sim.sim_id, None)
            self.jobs.finished(sim.job, "queued" if interrupted and sim.job.queue_id else "failed")
            return
        try:
            if interrupted is not None and sim.end_t is None:
                self.backend.stop(sim.sim_id)
            if failure is None:
                final = self.backend.observe(sim.sim_id)
                self._record(sim, final)
                if sim.end_t is None:
                    sim.end_t = final.t_s
            self._flush(sim)
        finally:
            self.backend.release(sim.sim_id)
        for rank in list(sim.inflight):
            self._follow_resize(sim, rank, ResizeState.FAILED, None, "the run ended first",
                                ended=True)  # fmt: skip
        for key in [k for k in self.retries if k[0] == sim.sim_id]:
            self.retries.pop(key, None)
            self.attempts.pop(key, None)
        result = self._result(sim, interrupted, failure)
        assert sim.run_id is not None
        self.store.finish_run(result)
        self.learned.clear()
        self.results.append(result)
        self.sims.pop(sim.sim_id, None)
        self.jobs.finished(sim.job, result.status)
        finished = self.now()
        self.event(result.id, "finished", status=result.status, iterations=result.iterations,
                   wall_s=round(result.wall_s, 3), reason=result.message or "")  # fmt: skip
        self.outcomes.append(
            SimOutcome(
                id=result.id,
                queue_id=sim.job.queue_id,
                case=result.case,
                n_ranks=result.n_ranks,
                status=result.status,
                iterations=result.iterations,
                expected_iterations=result.expected_iterations or 0,
                wall_s=result.wall_s,
                started_s=sim.started_s,
                finished_s=finished,
                run_dir=result.run_dir,
            )
        )

    def _result(self, sim: _Sim, interrupted: str | None, failure: str | None) -> RunResult:
        assert sim.staged is not None and sim.run_id is not None
        staged, last, plan = sim.staged, sim.last, sim.plan
        state = sim.parser.state
        wall_s = (sim.end_t if sim.end_t is not None else self.backend.clock()) - sim.t0
        exit_code = last.exit_code if last else None
        message: str | None
        if interrupted is not None:
            status, message = "interrupted", interrupted
        elif failure is not None:
            status, message = "failed", failure
        elif last is not None and last.phase is SimPhase.SUCCEEDED and state.ended:
            status = "completed"
            message = f"{CONVERGED} {state.iterations}" if state.converged else None
        else:
            status = "failed"
            why = last.reason if last and last.reason else f"exit code {exit_code}"
            if state.fatal and state.fatal not in why:
                why = f"{why} ({state.fatal})"
            message = f"{why}; see {staged.log_path}"
        ranks = []
        for r in plan.ranks:
            o = last.ranks[r.rank] if last and r.rank < len(last.ranks) else None
            ranks.append(
                RankResult(
                    rank=r.rank,
                    weight=r.weight,
                    cpu_millis=o.request_millis if o else r.cpu_millis,
                    limit_millis=o.limit_millis if o else r.limit_millis,
                    cpu_s=trapezoid_cpu_s(sim.times, sim.usages[r.rank]) if sim.usages else 0.0,
                    cpu_s_counter=(o.usage_ns / 1e9) if o else 0.0,
                    nr_throttled=o.nr_throttled if o else 0,
                    throttled_s=(o.throttled_ns / 1e9) if o else 0.0,
                    cells=staged.cells_per_rank[r.rank],
                    duty=_steady_duty(sim.duty_marks.get(r.rank, []), staged.expected_iterations),
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
            exit_code=exit_code,
            message=message,
            ranks=tuple(ranks),
            decompose=sim.job.submission.decompose,
            backend=self.backend.name,
            placement=self.backend.placement(),
            resizes=tuple(sim.resizes),
            restarts=sum(r.restarts for r in ranks),
            shared_s=None if sim.shared_s is None else round(sim.shared_s, 3),
            wait_modes=tuple(sim.waits),
        )

    # -- display -----------------------------------------------------------------------------

    def _views(self) -> list[SimView]:
        views = []
        for sim in self.sims.values():
            mem = self.state.sims.get(sim.sim_id)
            if sim.last is None:
                stage = "staging" if sim.staged is None else "starting"
                ranks: tuple[RankView, ...] = ()
            else:
                stage = mem.stage if mem else "starting"
                ranks = tuple(
                    RankView(
                        rank=r.rank,
                        request_millis=r.request_millis,
                        limit_millis=r.limit_millis,
                        cpu_cores=sim.cores[r.rank] if r.rank < len(sim.cores) else 0.0,
                        nr_throttled=r.nr_throttled,
                        duty=r.duty_window,
                        allocated_millis=r.allocated.request_millis if r.allocated else None,
                        restarts=r.restarts,
                        resize=(
                            str(r.resize.state)
                            if r.rank in sim.inflight and r.resize and not r.resize.state.final
                            else None
                        ),
                        resize_to_millis=(
                            sim.inflight[r.rank][2] if r.rank in sim.inflight else None
                        ),
                        resize_reason=(
                            r.resize.reason if r.resize and r.rank in sim.inflight else ""
                        ),
                    )
                    for r in sim.last.ranks
                )
            views.append(
                SimView(
                    sim_id=sim.sim_id,
                    run_id=sim.run_id,
                    run_dir=str(sim.staged.run_dir) if sim.staged else None,
                    case=sim.staged.case_name if sim.staged else sim.job.submission.case,
                    stage=stage,
                    elapsed_s=(self.backend.clock() - sim.t0) if sim.launched else 0.0,
                    log=sim.parser.state,
                    expected_iterations=sim.staged.expected_iterations if sim.staged else 0,
                    ranks=ranks,
                    queue_id=sim.job.queue_id,
                    resizes=sum(1 for r in sim.resizes if r.status == "completed"),
                    wait=sim.waits[-1] if sim.waits else None,
                )
            )
        return views


def _steady_duty(
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


def run_jobs(
    backend: Backend,
    store: Store,
    jobs: JobSource,
    settings: LoopSettings,
    *,
    display: Display | None = None,
    stop: threading.Event | None = None,
) -> LoopResult:
    """Drive ``jobs`` to the end on ``backend`` (the one entry point of every command)."""
    return ControlLoop(backend, store, jobs, settings, display=display, stop=stop).run()
