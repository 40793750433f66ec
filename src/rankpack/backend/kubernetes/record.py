"""What the Kubernetes backend knows of one simulation: its `Lifecycle` and its `SimRecord`.

The control loop's thread (`KubernetesBackend`: launch, observe, stop, release) and the
poller's (`poller`) share each record under the backend's lock. Where a simulation stands is
one value, `Lifecycle`: a `Stage` (pending, running, ended, released) and the few facts of
its outcome (exit code, the first failure and its rank, stopped on request). Every change of
stage is a method of `Lifecycle`, so the rules (the first failure wins, nothing fails after
the end, a stop after the end changes nothing) are written once.
"""

from __future__ import annotations

import contextlib
import enum
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from rankpack.backend.kubernetes.api.config import VolumeSource
from rankpack.backend.kubernetes.api.kubeapi import Obj
from rankpack.backend.kubernetes.nodes.nodereader import CpuCounters
from rankpack.backend.kubernetes.objects.groups import RankGroup, group_of
from rankpack.backend.mpirun import LogTail, Proc, ShimSample
from rankpack.backend.protocol import RankResources, ResizeStatus, SimSpec
from rankpack.core.failures import Failure
from rankpack.profile.finals import FinalRecord


def rank_dir(case_dir: Path) -> Path:
    """The backend's files on the case volume (hostfile, agent, shim library, exit code)."""
    return case_dir / ".rankpack"


class Stage(enum.Enum):
    PENDING = "pending"
    """Its objects exist (or are being created); mpirun has not started."""
    RUNNING = "running"
    """mpirun was started (by this process, or by the one it was adopted from)."""
    ENDED = "ended"
    """mpirun ended (or was never started and never will be)."""
    RELEASED = "released"
    """Its objects are deleted (or left to the poller) and its files closed."""


@dataclass
class Lifecycle:
    """Where one simulation stands; changed only through its methods (under the lock)."""

    stage: Stage = Stage.PENDING
    adopted: bool = False
    """Its mpirun is not this process's child: its end is read from the exit file."""
    exit_code: int | None = None
    failure: Failure | None = None
    """The first reason it cannot go on (a rank pod gone or broken, a launch that failed)."""
    failure_rank: int = 0
    failure_handled: bool = False
    """The failure was acted on (Event recorded, mpirun told to end): done once."""
    stopped: bool = False
    """Stopped on request before it ended."""

    @property
    def started(self) -> bool:
        return self.stage is not Stage.PENDING

    @property
    def ended(self) -> bool:
        return self.stage in (Stage.ENDED, Stage.RELEASED)

    @property
    def released(self) -> bool:
        return self.stage is Stage.RELEASED

    @property
    def over(self) -> bool:
        """Ended, or failed and ending: it will not run on."""
        return self.ended or self.failure is not None

    def start(self, *, adopted: bool = False) -> None:
        if self.stage is Stage.PENDING:
            self.stage = Stage.RUNNING
        self.adopted = self.adopted or adopted

    def fail(self, failure: Failure, rank: int = 0) -> None:
        """Record why it cannot go on, unless it ended, was stopped or failed already."""
        if not self.ended and not self.stopped and self.failure is None:
            self.failure, self.failure_rank = failure, rank

    def failure_to_handle(self) -> Failure | None:
        """The failure not acted on yet (then marked as acted on), else None."""
        if self.failure is None or self.failure_handled:
            return None
        self.failure_handled = True
        return self.failure

    def lose_node(self, failure: Failure) -> None:
        """A node of its pods is lost (``NodeLost``): recorded like `fail`, and also when
        mpirun has already ended with a failure (the lost node's doing), never after a stop
        or a success."""
        if self.stopped or self.failure is not None or (self.ended and self.exit_code == 0):
            return
        self.failure = failure

    def stop(self) -> None:
        if not self.ended:
            self.stopped = True

    def end(self, exit_code: int | None = None) -> None:
        """mpirun ended (with ``exit_code`` if known; a known code is kept)."""
        if exit_code is not None and self.exit_code is None:
            self.exit_code = exit_code
        if not self.released:
            self.stage = Stage.ENDED

    def release(self) -> None:
        self.stage = Stage.RELEASED


@dataclass
class PodResize:
    status: ResizeStatus
    target: RankResources
    generation: int | None


@dataclass
class SimRecord:
    """One simulation: its spec, its lifecycle, its pods as last listed, its files."""

    spec: SimSpec
    image: str
    volume: VolumeSource
    desired: list[RankResources]
    groups: tuple[RankGroup, ...]
    """Its rank groups: the ranks of each of its pods (decision 0012)."""
    life: Lifecycle = field(default_factory=Lifecycle)
    pods: dict[int, Obj] = field(default_factory=dict)
    """Each rank's group pod as last listed, by rank (the ranks of a group share it)."""
    seen: set[int] = field(default_factory=set)
    resizes: dict[int, PodResize] = field(default_factory=dict)
    nices_due: dict[int, dict[int, int]] = field(default_factory=dict)
    """The nice values of a group's ranks not set yet, by group index (the node could not
    set them at the resize: set at the next observation)."""
    process: Proc | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)
    log: LogTail = field(init=False)
    """The solver log not delivered yet (from its start, also when adopted)."""
    counters: dict[int, CpuCounters] = field(default_factory=dict)
    """Each rank's latest cgroup counters (kept while its node cannot be read)."""
    shim: dict[int, ShimSample] = field(default_factory=dict)
    """Each rank's latest shim sample (the records are in the rank pods' own volumes and
    read through their nodes, `readings`)."""
    finals: dict[int, FinalRecord] | None = None
    """The ranks' final records (on the case volume), read at the first observation of its
    end and kept (None: not read yet). Only the control loop's thread (`observe`) uses it."""
    unreadable: set[str] = field(default_factory=set)
    """Nodes whose readings were missing at the last observation (an outage under way:
    its Warning Event was recorded)."""
    created_t: float = field(default_factory=time.monotonic)
    unschedulable_t: float | None = None
    """When a pod of it was first seen unschedulable (None: none is now)."""
    launch_fd: int | None = None
    """The launch marker's locked descriptor while this process holds it (`exitwrapper`)."""
    reconcile_error: str | None = None
    """Creating its objects failed transiently; the poller tries again."""
    created_rv: str | None = None
    """The newest resourceVersion of its objects as created (or found) at launch: a cache
    that has taken in this much holds every one of them that still exists."""
    in_pod: bool = False
    """Its mpirun runs in its launcher pod (pod mode), not on this host."""
    launcher: Obj | None = None
    """Its launcher pod as last listed (pod mode)."""
    launcher_seen: bool = False
    """Its launcher pod was listed at least once (pod mode)."""
    launcher_missing: int = 0
    """Listings in a row, since it was created, without its launcher pod (pod mode)."""
    launcher_millis: int | None = None
    """Its launcher pod's CPU request when the namespace's LimitRange moved it from the
    configured one (pod mode; None: `KubernetesConfig.launcher_cpu_millis`)."""

    end_seen_s: float | None = None
    """When a failed end of mpirun was first judged (wall clock, `lostnodes.judge_end`)."""
    end_verdict: str | None = None
    """Whether a lost node was behind that end: ``lost``, ``alive`` (None: not known yet)."""

    def __post_init__(self) -> None:
        self.log = LogTail(self.spec.log_path)

    @property
    def n(self) -> int:
        return len(self.desired)

    def group(self, rank: int) -> RankGroup:
        """The group holding ``rank``."""
        return group_of(self.groups, rank)

    def pod_name(self, rank: int) -> str:
        """The name of the pod that holds ``rank``."""
        return self.group(rank).pod_name(self.spec.sim_id)

    def group_pods(self) -> list[Obj]:
        """Each group's pod as last listed (a pod not listed yet is left out)."""
        return [self.pods[g.ranks[0]] for g in self.groups if g.ranks[0] in self.pods]

    @property
    def exit_file(self) -> Path:
        return rank_dir(self.spec.case_dir) / "mpirun.exit"

    def close_launch(self) -> None:
        """Let go of the launch marker (the launcher and mpirun, if any, still hold it)."""
        if self.launch_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.launch_fd)
            self.launch_fd = None
