"""The decision step's values: what it reads, remembers, is tuned by and returns.

The decision step is a pure function ``decide(observations, state, settings) -> Decision``
(`rankpack.controller.policy`); this module holds those four types and their parts
(`Observations`, `ControllerState`, `ControllerSettings`, `Decision`), no rule. The control
loop builds `Observations` (`rankpack.controller.observing`) from the backend, the solver
logs and the PMPI shim's live records, calls `decide`, applies the `Action`s through the
backend, and records every action (with its reason) as an event. Time is a value in the
observations (``now_s``), never read from a clock inside the decision step, so tests drive
it with a fake clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, Protocol

from rankpack.core.actions import (
    Action,
    Resize,
    WaitMode,
    WaitSetting,
)
from rankpack.plan.submission import Phase

AUTO_LAUNCH_MODE: WaitMode = "spin"
"""The mode a simulation under ``auto`` is launched in; the controller switches it live."""

GateModel = Literal["limit", "duty", "beta", "off"]
DEFAULT_COLOCATION_EFFICIENCY = 0.78
"""Measured gain / physical limit assumed before this machine has a session of its own in
which simulations ran together. Polite waits with their sched_yield phase, a cgroup per
rank, 2 cores, two copies of the 48 900-cell pitzDaily packed (docs/benchmarks.md, issue
13, seventh session): weighted 1:3 0.67-0.79 (1.05-1.25x of a 1.53-1.60 limit), equal
0.78-0.92 (0.92-1.06x of 1.16-1.19); 0.78 is the median of those nine sessions (and of
the thirteen with the sixth session's four). The gate's predictions of those sessions
(x1.095 and x0.806 at 0.73, against the duty cycles known at launch) scale to x1.17 for
the weighted pair, which is packed, and x0.86 for the equal pair, which is held; 4-rank
pitzDaily (the gate's limit is 1: more ranks than cores) is held at any efficiency below
1. Once sessions of the workload have run two at once, their measured efficiency is
weighed against this prior (worth two sessions, see
`rankpack.controller.session.learned_efficiency`)."""


class RankReading(Protocol):
    """What the decision step reads of one rank: a `RankSnapshot`, or the backend's own
    observation of the rank (`rankpack.backend.protocol.RankObservation`), which the loop
    hands over as it is when it has nothing to add (no per-rank copy on a tick that
    observes a thousand ranks)."""

    @property
    def rank(self) -> int: ...
    @property
    def request_millis(self) -> int: ...
    @property
    def usage_ns(self) -> int: ...
    @property
    def compute_ns(self) -> int | None: ...
    @property
    def mpi_ns(self) -> int | None: ...
    @property
    def node(self) -> str | None: ...
    @property
    def pod(self) -> str | None: ...
    @property
    def readings_ok(self) -> bool: ...


@dataclass(frozen=True)
class RankSnapshot:
    rank: int
    request_millis: int
    """The request in force now."""
    usage_ns: int
    """Cumulative CPU time of the rank pod (cgroup counter)."""
    compute_ns: int | None
    """Cumulative time outside MPI, from the shim's live record (None: no shim data yet)."""
    mpi_ns: int | None
    """Cumulative time inside MPI calls, from the shim's live record."""
    node: str | None = None
    """The node the rank runs on (None: not placed yet)."""
    pod: str | None = None
    """The pod (local: the cgroup) it runs in; ranks of one simulation with the same pod
    share a cgroup (a rank group: decision 0012). None: not known yet."""
    readings_ok: bool = True
    """False: its node could not be read this time (the backend's
    ``RankObservation.readings_ok``): the counters are stale, nothing is decided on them."""


@dataclass(frozen=True)
class SimSnapshot:
    sim_id: str
    started_s: float
    """``now_s``-clock time the simulation was launched."""
    iterations: int
    """Completed time steps, from the solver log."""
    expected_iterations: int
    budget_millis: int
    """The most this simulation's requests may add up to."""
    ranks: tuple[RankReading, ...]
    phases: tuple[Phase, ...] = ()
    """A user-given phase schedule; when present it replaces duty-cycle sizing."""
    sizing: Literal["duty", "fixed"] = "duty"
    """duty: profile, then size ranks to their duty cycles; fixed: keep the planned requests
    (``rankpack run`` without ``--resize duty``)."""
    starting: bool = False
    """Still being staged or scheduled: no rank runs yet, its requests are reserved."""
    learned_duty: tuple[float, ...] = ()
    """Per-rank duty cycles learned from an earlier run of the same case, decomposition and
    ranks, whose sizes it starts with (`rankpack.controller.learned`): the simulation counts
    as ``sized`` from the start (no profiling window). Empty: nothing learned."""
    wait: WaitSetting = "spin"
    """How its ranks wait in MPI: a fixed mode (the controller never switches it) or
    ``auto`` (the wait rule's mode at launch; the controller switches it live)."""
    wait_mode: WaitMode | None = None
    """The mode its ranks were last set to (None: not known, taken as `AUTO_LAUNCH_MODE`)."""
    mpi_yields: bool = False
    """Its MPI library yields while idle when told to (Open MPI's ``mpi_yield_when_idle``):
    then its ranks may spin where they outnumber the cores in one rank group of their own
    (`rankpack.controller.waits`). MPICH's ch4 has no idle yield: False."""
    launched: bool = True
    """False: not launched yet (its case is staging, or staged and launched by this step);
    its ranks are its plan's, on the nodes the policy placed them (if any)."""
    observed_s: float | None = None
    """``now_s`` of the step it was observed for (None: this step). A snapshot observed
    before this step (the loop observes a steady simulation in turn, not every tick, on a
    large cluster) is not decided on again: nothing it shows has changed."""

    def fresh(self, now_s: float) -> bool:
        """It was observed for the step at ``now_s``."""
        return self.observed_s is None or self.observed_s >= now_s

    @property
    def progress(self) -> float:
        if self.expected_iterations <= 0:
            return 0.0
        return min(1.0, self.iterations / self.expected_iterations)

    @cached_property
    def requested_millis(self) -> int:
        return sum(r.request_millis for r in self.ranks)

    @cached_property
    def nodes(self) -> frozenset[str | None]:
        """The nodes its ranks are on (None: a rank not placed yet)."""
        return frozenset(r.node for r in self.ranks)

    @cached_property
    def unplaced(self) -> int:
        """How many of its ranks are on no node yet."""
        return sum(1 for r in self.ranks if r.node is None) if None in self.nodes else 0

    @cached_property
    def readings_ok(self) -> bool:
        """Every rank's node was read for this step: the decision step neither resizes nor
        switches the wait mode of a simulation with a stale rank (its node agent is away)."""
        return all(r.readings_ok for r in self.ranks)

    @cached_property
    def counter_duties(self) -> tuple[float, ...]:
        """Each rank's duty cycle from its cumulative shim counters (1.0 without them):
        what the launch gate counts for a simulation not sized yet."""
        out = []
        for r in self.ranks:
            c, m = r.compute_ns, r.mpi_ns
            out.append(c / (c + m) if c is not None and m is not None and c + m > 0 else 1.0)
        return tuple(out)

    @cached_property
    def counter_duty_sums(self) -> tuple[float, float, int]:
        """(sum, sum clamped to [0, 1], count) of `counter_duties`."""
        return duty_sums(self.counter_duties)

    @cached_property
    def shim(self) -> bool:
        """Every rank has published the shim's live record (duty cycles can be measured)."""
        return all(r.compute_ns is not None and r.mpi_ns is not None for r in self.ranks)


@dataclass(frozen=True)
class QueuedSim:
    queue_id: int
    n_ranks: int
    initial_request_millis: tuple[int, ...]
    """Per-rank requests it starts with (before its own profiling and sizing)."""
    duty: tuple[float, ...] = ()
    """Per-rank duty cycles it is known to have (learned from an earlier run of the same
    case, or from a running copy of it); empty: unknown."""
    retry_at_s: float | None = None
    """Its last launch was refused for a reason that passes (the namespace's quota): not
    launched again before this ``now_s`` (back-off); None: no such refusal."""
    retry_reason: str = ""
    """Why it was refused (for the hold's reason)."""
    ahead: str = ""
    """The simulation its case was staged ahead as, staged and ready to launch ('' none):
    staged by this step, it is launched in the same step (`rankpack.controller.staged`)."""
    wait: WaitSetting = "spin"
    """How its ranks will wait (its own setting, else the session's)."""
    ready: bool = True
    """Its case may be launched: staged ahead (``ahead``) and done, or (without
    ``launch_staged_only``) staged when the gate lets it pass. False: still staging ahead,
    or not staged ahead yet."""
    stage_failed: bool = False
    """Its staging ahead failed: claimed at once to record why (``launch_staged_only``)."""
    mpi_yields: bool = False
    """Its MPI library yields while idle when told to, as declared (its submission's MPI,
    else the session's): what a launch of its case staged ahead counts on in this step
    (`rankpack.controller.staged.ahead`; the policy switches it live if staging found
    another)."""


@dataclass(frozen=True)
class StagedSim:
    """A simulation whose case is staged: the step launches it (`rankpack.controller.staged`)."""

    sim_id: str
    queue_id: int
    request_millis: tuple[int, ...]
    """Per rank, its plan's request (learned sizes, or the gate's pack), as its snapshot
    shows them."""
    nodes: tuple[str, ...]
    """Per rank, the node the policy placed it on when it was staged (empty: none)."""
    wait: WaitSetting
    capacity_millis: int
    """The capacity left to this loop as its launch counts it (with its own CPU limits,
    ``--qos limits``, when a ``limits.cpu`` quota binds)."""
    mpi_yields: bool = False
    """Its MPI library yields while idle when told to (`SimSnapshot.mpi_yields`)."""


@dataclass(frozen=True)
class NodeCores:
    """One node as the wait rule sees it (`rankpack.controller.waits`)."""

    name: str
    allocatable_millis: int
    other_ranks: int = 0
    """Rank pods on it that this loop does not run (other rankpack sessions)."""
    others_millis: int = 0
    """CPU requested on it by pods this loop does not run (the launch pipeline's room,
    `rankpack.controller.room`)."""
    ours_ranks: int | None = None
    """Ranks of this loop's simulations on it, as observed (None: counted from the
    simulations, one by one)."""
    ours_millis: int | None = None
    """What those ranks request, as observed (None: counted from the simulations)."""
    rank_groups: bool = False
    """A simulation's ranks on it share one cgroup (`NodeCapacity.rank_groups`)."""


@dataclass(frozen=True)
class Observations:
    now_s: float
    capacity_millis: int
    """Allocatable CPU of the node(s) (the budget of all requests together)."""
    sims: tuple[SimSnapshot, ...]
    """Simulations running now."""
    queue: tuple[QueuedSim, ...]
    """Waiting simulations, first to launch first."""
    others_millis: int = 0
    """CPU requested on the node(s) by what this loop does not run (other rankpack sessions,
    other pods): what makes ``capacity_millis`` less than the node's."""
    nodes: tuple[NodeCores, ...] = ()
    """The nodes and their CPUs, for the wait rule (empty: one node of ``capacity_millis +
    others_millis``)."""
    capacity_bound: str = ""
    """What makes ``capacity_millis`` smaller than the nodes would (the namespace's
    ResourceQuota), for reasons; '' when the nodes bind."""
    rank_min_millis: int = 0
    """The least request a rank may have where ranks are placed (a LimitRange's ``min``):
    the policy's floor is raised to it."""
    rank_max_millis: int | None = None
    """The most request a rank may have there (a LimitRange's ``max`` or default limit);
    None: no bound."""
    rank_bounds: str = ""
    """What sets those bounds, for reasons ('' when none)."""
    staged: tuple[StagedSim, ...] = ()
    """Simulations whose case is staged, to launch in this step, in the order they were
    found staged (each is also in ``sims``, not launched)."""

    @cached_property
    def node_index(self) -> Mapping[str, NodeCores]:
        """The nodes by name."""
        return {n.name: n for n in self.nodes}

    @cached_property
    def counted_nodes(self) -> bool:
        """Every node counts what this loop's ranks request on it (`NodeCores.ours_millis`)."""
        return all(n.ours_millis is not None for n in self.nodes)


SimStage = Literal["warmup", "profiling", "sized", "scheduled", "fixed"]


@dataclass(frozen=True)
class SimMemory:
    """What the controller remembers about one running simulation between steps."""

    stage: SimStage = "warmup"
    profile_start_s: float | None = None
    profile_start: tuple[tuple[int, int], ...] = ()
    """(compute_ns, mpi_ns) per rank at the start of the profiling window."""
    profile_start_usage: tuple[int, ...] = ()
    """usage_ns per rank at the start of the profiling window."""
    profile_start_progress: float = 0.0
    """The simulation's progress (0..1) at the start of the profiling window."""
    duty: tuple[float, ...] = ()
    """Duty cycle per rank measured over the profiling window."""
    phase_index: int = -1
    """Index of the phase of the schedule in force (-1: none applied yet)."""
    rate_marks: tuple[tuple[float, int], ...] = ()
    """Recent (now_s, iterations) marks, for progress rates."""
    last_adjust_s: float | None = None
    last_adjust_sign: int = 0
    """+1 raised, -1 lowered by the last fairness adjustment; 0 none."""
    wait_mode: WaitMode | None = None
    """The wait mode last switched to (``auto`` only); None: still the launch mode."""

    @cached_property
    def duty_sums(self) -> tuple[float, float, int]:
        """(sum, sum clamped to [0, 1], count) of ``duty`` (the launch gate's loads)."""
        return duty_sums(self.duty)


def duty_sums(duties: tuple[float, ...]) -> tuple[float, float, int]:
    """(sum, sum clamped to [0, 1], count) of duty cycles, summed in order."""
    return sum(duties), sum(min(1.0, max(0.0, d)) for d in duties), len(duties)


@dataclass(frozen=True)
class ControllerState:
    sims: Mapping[str, SimMemory] = field(default_factory=dict)
    last_launch_s: float | None = None
    launch_held: str | None = None
    """Why the head of the queue was last held back (a short code such as ``no-room``), so a
    ``launch-held`` note is recorded only when the reason changes; None: not held."""
    fairness_engaged: bool = False
    """A fairness episode is under way: keep adjusting until the gap is below half the
    threshold (hysteresis)."""
    head_no_room: tuple[int, float] | None = None
    """(queue id, since ``now_s``): the head of the queue has not fitted since then; while
    it has waited less than ``backfill_wait_s``, smaller simulations behind it may start."""
    launch_bucket: tuple[float, float] | None = None
    """(launches the rate allows, at ``now_s``) of the launch rate's bucket; None: full."""
    resize_queue: tuple[Resize, ...] = ()
    """Resizes decided and not sent yet: the resize rate held them (decreases first,
    oldest first, `rankpack.controller.pacing`)."""
    resize_bucket: tuple[float, float] | None = None
    """(resizes the cluster's rate allows, at ``now_s``); None: full."""
    resize_node_buckets: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """Per node whose bucket is not full: (resizes it allows, at ``now_s``)."""


@dataclass(frozen=True)
class ControllerSettings:
    warmup_fraction: float = 0.1
    """Skip this fraction of a run (its start-up transient) before profiling."""
    warmup_min_iterations: int = 3
    """...and at least this many iterations."""
    warmup_max_s: float = 60.0
    """...but a run launched this many seconds ago is past its warm-up whatever its
    progress (a 200 000-iteration run would otherwise be profiled after 20 000 iterations,
    holding the queue behind it as "measuring" all that while)."""
    profile_s: float = 5.0
    """Length of the profiling window, seconds..."""
    profile_progress: float = 0.1
    """...or shorter, once this fraction of the run has been profiled (a short run is sized
    while there is still time for it to matter)..."""
    profile_min_s: float = 1.0
    """...but never shorter than this."""
    floor_millis: int = 50
    """No rank is sized below this request."""
    headroom: float = 1.25
    """Sized request = measured compute CPU x headroom."""
    max_concurrent: int = 4
    launch_staged_only: bool = False
    """Launch only simulations whose case was staged ahead (the operator: a case is a less
    trusted user's, and its staging may run to the admin's deadline): the loop stages up to
    ``max_starting`` of the queue ahead at once, the gate passes over those still staging
    (FIFO among the staged), and one whose staging failed is claimed at once to record why.
    A staging then never holds a place among the running nor another's launch."""
    launch_must_fit: bool = False
    """Requests must fit the unrequested capacity even when nothing runs (Kubernetes: a pod
    that does not fit is never scheduled): a launch is held until the floors fit, and the
    loop scales the initial requests down to what is free."""
    launch_cooldown_s: float = 2.0
    """A node takes at most one launch per this many seconds (with one node: wait this long
    after a launch before the next one; a guard against a launch the observations do not
    show yet)."""
    launch_rate_per_s: float = 1.0
    """Launches per second over the whole cluster (a bucket of ``launch_burst``): what the
    launch pipeline may ask of the apiserver and the scheduler."""
    launch_burst: int = 4
    """The most launches at once (in one step, after a quiet while)."""
    max_starting: int = 8
    """The most simulations being staged or started at once (launches in flight: each
    stages its case in parallel with the others)."""
    resize_rate_per_s: float = 50.0
    """Resizes per second over the cluster (a bucket of ``resize_burst``): each is a patch
    to the apiserver (`rankpack.controller.pacing`)."""
    resize_burst: int = 200
    resize_rate_per_node_s: float = 10.0
    """Resizes per second on one node (a bucket of ``resize_node_burst``): each is a change
    its kubelet applies."""
    resize_node_burst: int = 64
    backfill_wait_s: float = 600.0
    """Backfill: while the head of the queue does not fit (``no-room``), the first of the
    next ``backfill_scan`` simulations that would be launched is, ahead of it - until the
    head has waited this long; then nothing more starts before it (so a wide simulation is
    not starved by narrow ones, and a narrow one not by a wide one). 0: strict FIFO."""
    backfill_scan: int = 32
    """How many simulations behind the head backfill looks at, per step."""
    min_predicted_gain: float = 0.05
    """Launch only if the model predicts throughput(N+1) >= (1 + this) x throughput(N)."""
    gate: GateModel = "limit"
    """The throughput model that gates launches: ``limit`` (the work-conserving bound of
    `rankpack.model.limit` x ``colocation_efficiency``), ``duty`` (the duty-cycle overlap
    predictor of `rankpack.model.overlap`), ``beta`` (seed 001's linear model with
    ``fitted_beta``) or ``off`` (launch whenever ``max_concurrent`` allows, packing
    requests to fit)."""
    colocation_efficiency: float = DEFAULT_COLOCATION_EFFICIENCY
    """``limit`` gate: the fraction of the physical limit co-located simulations reach
    (measured gain / limit; learned from this machine's recorded sessions of the same
    workload, else of others, when there are
    any, see `rankpack.controller.session.choose_gate`)."""
    fitted_beta: float | None = None
    """``beta`` gate: the contention coefficient (seed 001 eq. 5), given or fitted from
    sessions recorded on this machine with the same ranks per simulation and capacity."""
    fairness_threshold: float = 0.10
    """Act when the slowest simulation's progress rate is this far behind the fastest."""
    fairness_step: float = 0.10
    """At most this fraction of change to a simulation's requests per adjustment."""
    fairness_cooldown_s: float = 6.0
    """Minimum time between two fairness adjustments of the same simulation."""
    rate_window_s: float = 6.0
    """Progress rates are measured over this trailing window."""


@dataclass(frozen=True)
class Decision:
    state: ControllerState
    actions: tuple[Action, ...]
