"""What the control loop holds: its settings, each simulation it follows, and its tallies.

`LoopSettings` is how a command configures the loop. `Tracked` is one simulation from the
moment the loop claims its job until it is recorded as ended: its plan, what it was last
observed doing, its samples not yet stored, its wait modes. `LoopContext` is what the
loop's rooms share (`launching`, `resizes`, `outcomes`, `snapshot`): the backend, the
store, the job source, the simulations and the policy's memory, and the event recorder.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankpack.backend.protocol import Backend, SimObservation, StagedCase
from rankpack.case.foamlog import LogParser
from rankpack.controller.decision import ControllerSettings, ControllerState
from rankpack.controller.jobs import Job, JobSource
from rankpack.controller.views import LoopResult, SimOutcome, StageFailure
from rankpack.core.actions import WaitMode, WaitSetting
from rankpack.core.results import ResizeRecord, RunResult, WaitRecord
from rankpack.plan.allocation import Plan
from rankpack.plan.images import ImageSolvers
from rankpack.store import SampleRow, Store


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
    sim_labels: dict[str, str] = field(default_factory=dict)
    """Labels every simulation's objects carry besides the run id (the operator marks its
    own, so that it never takes another controller's for an orphan)."""
    """When the loop is stopped, leave launched simulations running for a later controller
    to adopt (the operator) instead of stopping them (`rankpack run`, `multiplex`)."""
    solvers: frozenset[str] | None = None
    """Applications a simulation may run (the operator's allowlist): a case whose
    application is not one of them fails at launch, before any rank pod exists (None: any)."""
    image_solvers: ImageSolvers = ()
    """With ``solvers``: image prefixes whose images run only the solvers named instead
    (`rankpack.plan.images.solvers_for`)."""
    confine_staging: bool = False
    """Stage cases as the operator must, for users with fewer rights: none of a case's code
    runs and nothing outside it is read (`rankpack.case.confine`); off for `run` and
    `multiplex`, where users stage their own cases."""
    case_scan: bool = True
    """With ``confine_staging``: refuse case code the scanner finds (`rankpack.case.confine`)
    before staging runs a tool; defence in depth behind the staging sandbox."""
    prestage: bool = True
    """While simulations run, stage the head of the queue ahead of its launch (copy, mesh,
    decompose), so that when it is launched - at once, or after the running ones end - it
    starts without a staging gap. Its copy is removed if it is never launched."""
    observe_ranks_per_tick: int = 1000
    """A tick observes every simulation with something under way, and the steady others in
    turn within this many ranks (all of them while they hold fewer), each at least every
    ``observe_max_age_s`` (`rankpack.controller.schedule`)."""
    observe_max_age_s: float = 10.0
    """The longest a steady simulation goes unobserved, seconds."""
    samples_per_s: int = 1000
    """Rank samples (`SampleRow`) the store receives per second at most: every observation
    while the loop holds fewer ranks; above, each simulation's samples are that much
    further apart (live ranks / this, seconds), its first and last always kept."""


@dataclass
class Tracked:
    """One simulation as the loop holds it (staging, launched, until recorded as ended)."""

    job: Job
    sim_id: str
    plan: Plan
    queued_s: float
    wait_setting: WaitSetting
    """How its ranks wait: its submission's mode, else the session's (`waits.setting`)."""
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
    """Resizes settled (completed or not), as recorded."""
    restarts: dict[int, int] = field(default_factory=dict)
    duty_marks: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    """rank -> [(iterations, compute_ns, mpi_ns)], for the steady-state duty."""
    cores: tuple[float, ...] = ()
    wait_mode: WaitMode | None = None
    """The wait mode its ranks were last set to (launch mode, then live switches); None
    without the shim."""
    idle_yield: bool = False
    """The MPI library's own idle yield, as the wait rule gave it at launch."""
    mpi: str = "openmpi"
    """The MPI library its solver runs with (its submission's, else the session's)."""
    waits: list[WaitRecord] = field(default_factory=list)
    """Each mode its ranks got, when, and why (per rank): its result's ``wait_modes``."""
    learned_duty: tuple[float, ...] = ()
    """Duty cycles of the earlier run its sizes were learned from (see `learned`)."""
    start: str = "profiled"
    """How it starts (`learned.start_of`): learned, profiled or plan; in its run's options."""
    learned_from: int | None = None
    """The run its sizes were learned from (None: none)."""
    staging_from_s: float | None = None
    """Loop time its case began staging (at its claim, or ahead of it); None: not known."""
    staged_at_s: float | None = None
    """Loop time the loop found its case staged."""
    readings_ok: bool = True
    """Every rank's node was read at its last observation."""
    nodes: tuple[str, ...] = ()
    """Per rank, the node the policy placed it on (`StageJob.nodes`, then `Launch.nodes`);
    empty: none decided. Until its pod is bound a rank counts on this node."""
    sampled_t: float | None = None
    """When its last samples were taken (seconds since its launch)."""
    shared_s: float | None = 0.0
    """Seconds it ran beside another launched simulation of this loop, to the tick (None:
    unknown, adopted from an earlier controller); recorded with its result."""
    resumed: dict[str, Any] = field(default_factory=dict)
    """A run that resumes one a lost node cut short: from which time, the iterations lost,
    the run lost (recorded in its run's options; `requeue.resumed_facts`)."""

    @property
    def mpi_yields(self) -> bool:
        """Its MPI library yields while idle when told to (Open MPI; MPICH's ch4 does not)."""
        return self.mpi == "openmpi"

    @property
    def launched(self) -> bool:
        return self.run_id is not None

    @property
    def running(self) -> bool:
        return self.launched and self.end_t is None


@dataclass
class Tally:
    """What the loop has done so far: its `LoopResult` once it stops."""

    results: list[RunResult] = field(default_factory=list)
    outcomes: list[SimOutcome] = field(default_factory=list)
    stage_failures: list[StageFailure] = field(default_factory=list)
    resizes: int = 0
    rejected: int = 0
    restarts: int = 0
    max_seen: int = 0

    def result(self, status: str) -> LoopResult:
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


@dataclass(frozen=True)
class Requeued:
    """A job whose launch was refused for a reason that passes (the namespace's quota) and
    that went back to its queue: when it may be launched again, and why."""

    attempts: int
    """Refusals in a row."""
    retry_at_s: float
    """Loop time before which it is not launched again (`policy.requeue_delay_s`)."""
    reason: str


@dataclass
class LoopContext:
    """What the loop's rooms share."""

    backend: Backend
    store: Store
    jobs: JobSource
    settings: LoopSettings
    t0: float
    """Backend clock at the session's start: events' ``t_s`` count from here (a caller
    running several loops in one session passes the same t0 to each)."""
    stop: threading.Event = field(default_factory=threading.Event)
    sims: dict[str, Tracked] = field(default_factory=dict)
    state: ControllerState = field(default_factory=ControllerState)
    """The policy's memory, as its last decision returned it."""
    tally: Tally = field(default_factory=Tally)
    requeued: dict[int, Requeued] = field(default_factory=dict)
    """Queue id -> its last refused launch, while it waits to be launched again."""

    def now(self) -> float:
        return self.backend.clock() - self.t0

    def event(self, run_id: int | None, name: str, **detail: Any) -> None:
        self.store.add_event(
            run_id, name, detail, multiplex_id=self.settings.multiplex_id, t_s=round(self.now(), 3)
        )

    def flush(self, sim: Tracked) -> None:
        """Store its samples not stored yet and its progress."""
        if sim.run_id is not None and sim.pending_samples:
            self.store.add_samples(sim.run_id, sim.pending_samples)
            self.store.update_progress(sim.run_id, sim.parser.state.iterations)
        sim.pending_samples = []
