"""Backend protocol v2: the interface every backend implements, and the values that cross it.

The control loop (`rankpack.controller.loop`) only sees these types, so the local backend
(a run's ranks in one cgroup, weighted by nice values), the simulated backend (virtual
time, for fast tests of the loop) and the Kubernetes backend (one pod per rank, resized
through ``pods/resize``) are driven by the same code. Backends carry out actions and report
what they see; they decide nothing.

Simulations are named by ``sim_id`` (not by in-process handles), so a controller process
can `Backend.list` and `Backend.adopt` what an earlier one started. Every call returns
quickly: staging (copy, mesh, decompose) and resizes run asynchronously and their outcome
arrives in later observations; `Backend.wait` blocks until the next event of *any*
simulation (or the timeout), so the loop never polls simulations one by one.
See ``docs/decisions/0007-backend-protocol-v2.md``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rankpack.case.staging import StagedCase, StageSpec
from rankpack.core.actions import WaitMode
from rankpack.core.failures import FailureCode
from rankpack.profile.finals import FinalRecord

__all__ = ["StageSpec", "StagedCase"]


class SimPhase(enum.StrEnum):
    STAGING = "staging"
    """The case is being copied, meshed and decomposed."""
    STAGED = "staged"
    """Ready to launch."""
    PENDING = "pending"
    """Launched, ranks not all running yet (scheduling, image, container start)."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def ended(self) -> bool:
        return self in (SimPhase.SUCCEEDED, SimPhase.FAILED)


class RankPhase(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ResizeState(enum.StrEnum):
    PENDING = "pending"
    """Asked for; the backend has not started applying it."""
    IN_PROGRESS = "in-progress"
    COMPLETED = "completed"
    DEFERRED = "deferred"
    """Accepted but cannot be applied now (node busy); may complete later."""
    INFEASIBLE = "infeasible"
    """Can never be applied on this node."""
    REJECTED = "rejected"
    """Refused outright (validation, admission, a cgroup write refused)."""
    FAILED = "failed"

    @property
    def final(self) -> bool:
        return self not in (ResizeState.PENDING, ResizeState.IN_PROGRESS, ResizeState.DEFERRED)


@dataclass(frozen=True)
class RankResources:
    """A rank pod's CPU: the request (scheduling weight) and an optional hard limit."""

    request_millis: int
    limit_millis: int | None = None


@dataclass(frozen=True)
class ShimSpec:
    """Load the PMPI shim into every rank; the backend delivers its counters."""

    wait_mode: WaitMode = "spin"
    flavour: str = "openmpi"


@dataclass(frozen=True)
class SimSpec:
    """Everything a backend needs to start one MPI simulation.

    The local backend uses ``case_dir`` on this machine; a cluster backend mounts ``volume``
    (a PersistentVolumeClaim, or a host directory on the dev cluster) at the same path in
    every rank pod, and runs ``image``.
    """

    sim_id: str
    """Unique within the database, e.g. ``r12``; names the rank pods / cgroups."""
    case_dir: Path
    """The prepared (meshed, decomposed) case; the working directory of every rank."""
    command: tuple[str, ...]
    """The program each rank runs, e.g. ``("simpleFoam", "-parallel")``; no launcher."""
    ranks: tuple[RankResources, ...]
    log_path: Path
    """Where the MPI job's stdout and stderr go (rank 0 prints the solver log)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for every rank."""
    mpi: str = "openmpi"
    shim: ShimSpec | None = None
    image: str | None = None
    pull_secrets: tuple[str, ...] = ()
    """Secrets of its namespace that pull ``image``, by name (Kubernetes)."""
    volume: str | None = None
    namespace: str | None = None
    """Where it runs, for a backend that places in several (the operator serving several
    Kubernetes namespaces); None: the backend's own."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Put on everything the backend creates for this simulation."""
    placement: Mapping[str, str] = field(default_factory=dict)
    """Hints: e.g. a node selector."""
    rank_nodes: tuple[str, ...] = ()
    """Per rank, the node the controller placed it on (Kubernetes: a required node affinity
    on ``kubernetes.io/hostname``, so the scheduler's fit check still applies); empty: no
    node decided, the backend (scheduler) places the ranks."""


@dataclass(frozen=True)
class ResizeStatus:
    """The state of the last resize of one rank."""

    state: ResizeState
    from_millis: int
    to_millis: int
    requested_t_s: float
    """Backend clock (monotonic) when the resize was asked for."""
    latency_s: float | None = None
    """Request to confirmation, once final."""
    reason: str = ""
    code: FailureCode | None = None
    """Why it was refused, as a code, when the backend knows (`FailureCode.QUOTA_EXCEEDED`:
    the namespace's quota had no room; the rank keeps its request)."""


@dataclass(frozen=True)
class RankObservation:
    rank: int
    phase: RankPhase
    desired: RankResources
    """What was last asked for."""
    allocated: RankResources | None
    """What is in force on the node (None while unknown)."""
    usage_ns: int
    """Cumulative CPU time of the rank pod."""
    nr_throttled: int = 0
    throttled_ns: int = 0
    restarts: int = 0
    """How often the rank's process was (re)started beyond the first time."""
    reason: str = ""
    node: str | None = None
    pod: str | None = None
    resize: ResizeStatus | None = None
    compute_ns: int | None = None
    """The shim's cumulative time outside MPI (None: no shim data yet)."""
    mpi_ns: int | None = None
    duty_window: float | None = None
    """The shim's duty cycle over its latest window."""
    wait_mode: str | None = None
    """The wait mode the rank's shim used at its latest wait (None: no shim data)."""
    readings_ok: bool = True
    """False: the rank's node could not be read for this observation (Kubernetes: its node
    agent is unreachable); the counters and shim values are the last ones read, not fresh,
    and the controller decides nothing for the simulation until they are."""
    final: FinalRecord | None = None
    """The rank's totals as its shim wrote them when it ended (`rankpack.profile.finals`):
    set once the simulation has ended, if the rank wrote a valid one. They outlive the
    rank (its live record may not), so a controller that adopts a run which ended while it
    was away still has the rank's duty cycle and CPU-seconds."""

    @property
    def request_millis(self) -> int:
        return self.desired.request_millis

    @property
    def limit_millis(self) -> int | None:
        return self.desired.limit_millis


@dataclass(frozen=True)
class SimObservation:
    sim_id: str
    t_s: float
    """Backend clock (monotonic seconds) when the counters were read."""
    phase: SimPhase
    ranks: tuple[RankObservation, ...]
    exit_code: int | None = None
    """The MPI launcher's exit code once it has ended."""
    reason: str = ""
    """Why it failed or is pending (e.g. ``rank 2 killed by signal 9``)."""
    failure: FailureCode | None = None
    """The failure's code, set by the backend where it saw the failure (with ``reason`` as
    its message); None while nothing failed or no code is known."""
    log_text: str = ""
    """Solver log text appended since the previous `observe` of this simulation."""
    staged: StagedCase | None = None
    stage_error: str | None = None
    """Why staging failed (the case is bad); set with phase FAILED before any launch."""


@dataclass(frozen=True)
class NodeCapacity:
    name: str
    allocatable_millis: int
    requested_millis: int
    """Requests already placed on the node (by anyone)."""
    rank_pods: int = 0
    """Rank pods (local: rank cgroups) of any rankpack simulation live on the node."""
    rank_groups: bool = False
    """The backend runs a simulation's ranks on this node in one cgroup (a rank group,
    decision 0012), so they can yield their cores to each other."""


@dataclass(frozen=True)
class Quota:
    """A namespace ResourceQuota on CPU (``requests.cpu``, or ``cpu`` which means the same;
    or ``limits.cpu``): Kubernetes refuses a pod or a ``pods/resize`` that would take the
    namespace past it."""

    name: str
    hard_millis: int
    used_millis: int
    """Requests (limits) of every pod of the namespace, rankpack's included."""
    resource: str = "requests.cpu"
    """``requests.cpu`` or ``limits.cpu``."""

    @property
    def free_millis(self) -> int:
        return max(0, self.hard_millis - self.used_millis)


@dataclass(frozen=True)
class RankBounds:
    """The CPU request a rank may have in the namespace the backend places in (Kubernetes:
    its LimitRange; an admission plugin refuses a pod, or a ``pods/resize``, outside it)."""

    min_millis: int = 0
    max_millis: int | None = None
    """None: no upper bound."""
    default_limit_millis: int | None = None
    """A CPU limit every rank pod without one gets (the LimitRange's ``default``): a hard
    limit the ranks are throttled at, which also bounds the request from above."""
    source: str = ""
    """What sets them, for reasons (e.g. ``LimitRange lr (Container: min 100m, max 1)``)."""

    def clamp(self, millis: int) -> int:
        high = self.max_millis if self.max_millis is not None else millis
        return max(self.min_millis, min(millis, high))

    @property
    def empty(self) -> bool:
        """No request satisfies them (min above max)."""
        return self.max_millis is not None and self.min_millis > self.max_millis


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[NodeCapacity, ...]
    """The nodes ranks can be placed on now (Ready and schedulable)."""
    quota: Quota | None = None
    """The tightest CPU-request quota of the namespace the backend places in (None: none)."""
    unready_millis: int = 0
    """What schedulable nodes that are not Ready now (lost, or starting) can allocate: not
    placeable now, but a simulation that fits once they are back must wait, not be refused."""
    launch_overhead_millis: int = 0
    """What the backend requests for each simulation beside its ranks (the Kubernetes
    backend's launcher pod): kept free for the next launch, so that its ranks and its
    launcher both fit."""
    limits_quota: Quota | None = None
    """The tightest ``limits.cpu`` quota of that namespace (None: none): it binds rank pods
    that carry a CPU limit (``--qos limits``, or a LimitRange's default limit)."""
    rank_bounds: RankBounds | None = None
    """What a rank's request may be there (None: anything)."""

    @property
    def allocatable_millis(self) -> int:
        return sum(n.allocatable_millis for n in self.nodes)

    @property
    def all_nodes_millis(self) -> int:
        """What every schedulable node, Ready or not, can allocate: the most a simulation
        could ever be given."""
        return self.allocatable_millis + self.unready_millis


@dataclass(frozen=True)
class SimRef:
    """A simulation the backend knows of (possibly started by an earlier process)."""

    sim_id: str
    phase: SimPhase
    labels: Mapping[str, str] = field(default_factory=dict)


class BackendError(Exception):
    """A backend could not carry out an action (the cluster refused, a write failed)."""


class UnknownSimulation(BackendError):
    """No simulation with that id exists in this backend."""


class LaunchFailed(BackendError):
    """The simulation could not be started; nothing of it is left running. ``code`` says
    why (`FailureCode.LAUNCH_FAILED` unless the backend knows better)."""

    def __init__(self, message: str, code: FailureCode = FailureCode.LAUNCH_FAILED) -> None:
        super().__init__(message)
        self.code = code


class LaunchRefused(LaunchFailed):
    """The launch was refused for a reason that passes (``code``: `FailureCode.QUOTA_EXCEEDED`,
    the namespace's quota has no room now, e.g. another tenant took it between plan and
    create): nothing of it was created or is left (what was created is deleted), and its
    case is still staged (``release`` removes the copy, as for any simulation never
    launched). The caller tries again later; it is not a failure of the simulation."""

    def __init__(self, message: str, code: FailureCode = FailureCode.QUOTA_EXCEEDED) -> None:
        super().__init__(message, code)


class Backend(Protocol):
    name: str

    def inventory(self) -> Inventory:
        """Nodes this backend places ranks on, with allocatable and requested CPU."""
        ...

    def placement(self) -> dict[str, str]:
        """Backend-specific facts recorded with every run (cgroup version, namespace, ...)."""
        ...

    def clock(self) -> float:
        """The backend's clock (monotonic seconds; virtual for the simulated backend)."""
        ...

    def stage(self, spec: StageSpec) -> None:
        """Start preparing a case; returns at once. The outcome arrives in `observe`."""
        ...

    def launch(self, spec: SimSpec) -> None:
        """Start the ranks; returns once they are created (not necessarily running)."""
        ...

    def resize(self, sim_id: str, rank: int, resources: RankResources) -> ResizeStatus:
        """Ask for a rank's new CPU in place; the rank keeps running. Returns the state
        known at once (completed for a cgroup write, pending for an API request); later
        states arrive in `observe`."""
        ...

    def set_wait_mode(self, sim_id: str, mode: WaitMode) -> None:
        """Ask every rank of a running simulation to wait in MPI in ``mode`` (``spin``,
        ``polite``, ``adaptive``) from its next wait on, without a restart: the shim's
        control word in each rank's live record. Raises BackendError for an unknown mode,
        a simulation launched without the shim, or a rank whose record is not published
        yet (try again later); the ranks' `RankObservation.wait_mode` shows the switch."""
        ...

    def observe(self, sim_id: str) -> SimObservation: ...

    def wait(self, timeout_s: float) -> None:
        """Block until any simulation has news (staged, ended, a resize settled) or the
        timeout passes. The simulated backend advances its virtual clock instead."""
        ...

    def stop(self, sim_id: str) -> None:
        """Terminate every process of the simulation (idempotent)."""
        ...

    def release(self, sim_id: str) -> None:
        """Remove what `launch` created (cgroups, pods); after the final `observe`.
        Idempotent; the run directory and logs stay."""
        ...

    def list(self) -> tuple[SimRef, ...]:
        """Simulations this backend holds, including ones an earlier process launched."""
        ...

    def adopt(self, sim_id: str, spec: SimSpec) -> None:
        """Take over a simulation an earlier controller process launched (see `list`)."""
        ...
