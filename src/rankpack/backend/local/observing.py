"""One local run and what it looks like now: the state `LocalBackend` keeps per simulation,
and its observation (phase, ranks, counters, the shim's records, the solver log, why it
failed; once it has ended, the ranks' final records, read once).

A rank's counters come from its own cgroup (``cpu.stat``) when it has one (a run with hard
limits), else from ``/proc/<pid>/stat`` of the pid the launcher recorded (a rank group's
ranks share the run's cgroup; an uncontained run has none). A run ends when its mpirun does (a
waiter thread of the backend sets ``ended``); an adopted run, whose mpirun is not our child,
ends when its cgroups are empty, with no exit code.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from rankpack.backend import ranknice
from rankpack.backend.local.launching import LAUNCHER_NO_CGROUP, LAUNCHER_NO_RANK
from rankpack.backend.local.rankcgroups import RunCgroups
from rankpack.backend.mpirun import (
    LogTail,
    MpirunProcess,
    ShimRecords,
    exit_failure,
    read_final_records,
)
from rankpack.backend.protocol import (
    RankObservation,
    RankPhase,
    RankResources,
    ResizeStatus,
    SimObservation,
    SimPhase,
    SimSpec,
)
from rankpack.core.failures import Failure, FailureCode
from rankpack.profile.finals import FinalRecord

CLK_TCK = os.sysconf("SC_CLK_TCK")


def run_failure(code: int | None, *, stopped: bool, adopted: bool) -> Failure | None:
    """Why a local run whose mpirun ended with ``code`` failed; None if it succeeded.

    As `rankpack.backend.mpirun.exit_failure`, and: an adopted run's mpirun is not our child,
    so its code is unknown (None) and its end (empty cgroups) counts as success; the
    rank launcher's own exit codes (no MPI rank, cannot join its cgroup) are
    LAUNCH_FAILED.
    """
    if not stopped and adopted and code is None:
        return None
    failure = exit_failure(code, stopped=stopped)
    if failure is not None and code in (LAUNCHER_NO_RANK, LAUNCHER_NO_CGROUP) and not stopped:
        return Failure(FailureCode.LAUNCH_FAILED, failure.message)
    return failure


@dataclass
class LocalRun:
    """What the local backend holds for one launched or adopted simulation."""

    sim_id: str
    spec: SimSpec
    cgroups: RunCgroups | None
    """None when the run is uncontained (``--no-cgroups``)."""
    pid_dir: Path
    desired: list[RankResources]
    """The ranks' CPU as last set (launch, resize, or read back when adopted)."""
    log: LogTail
    shim: ShimRecords
    process: MpirunProcess | None = None
    """None for a simulation adopted from an earlier rankpack process."""
    log_file: IO[bytes] | None = field(default=None, repr=False)
    exit_code: int | None = None
    ended: bool = False
    stopped: bool = False
    released: bool = False
    pids: dict[int, str] = field(default_factory=dict)
    """Each rank's pid as last read from its pid file (a new pid is a restart)."""
    restarts: dict[int, int] = field(default_factory=dict)
    resizes: dict[int, ResizeStatus] = field(default_factory=dict)
    last_usage_ns: dict[int, int] = field(default_factory=dict)
    """Uncontained runs: the highest /proc usage seen (a rank's usage never goes back)."""
    finals: dict[int, FinalRecord] | None = None
    """The ranks' final records, read at the first observation of its end (None: not yet)."""

    def observe(self, now: float) -> SimObservation:
        """The run at ``now`` (also delivers the log's new lines)."""
        if self.process is not None and self.exit_code is None:
            self.exit_code = self.process.poll()
            self.ended = self.exit_code is not None
        ended = self.ended
        if ended and self.finals is None:  # its ranks have exited: their files are complete
            self.finals = read_final_records(self.spec)
        ranks = tuple(self._observe_rank(i, ended) for i in range(len(self.desired)))
        log_text = self.log.read(ended=ended)
        failure = None
        if not ended:
            phase = SimPhase.RUNNING if self.pids else SimPhase.PENDING
        else:
            failure = run_failure(
                self.exit_code, stopped=self.stopped, adopted=self.process is None
            )
            phase = SimPhase.FAILED if failure is not None else SimPhase.SUCCEEDED
        return SimObservation(
            self.sim_id, now, phase, ranks, exit_code=self.exit_code,
            reason=failure.message if failure else "",
            failure=failure.code if failure else None, log_text=log_text,
        )  # fmt: skip

    def apply_nice(self) -> None:
        """Give each started rank of a rank group the nice value of its request among the
        group's (`rankpack.backend.ranknice`); ranks that ended are skipped. OSError if the
        kernel refuses."""
        for i in range(len(self.desired)):
            pid = _read_pid(self.pid_dir / f"rank-{i}.pid")
            if pid is not None:
                self._set_nice(i, pid)

    def _set_nice(self, i: int, pid: str) -> None:
        """Rank ``i`` (process ``pid``) at the nice value of its request now; a rank that
        ended (or a pid file that is not a pid) is skipped. OSError if the kernel refuses."""
        nice = ranknice.nices([r.request_millis for r in self.desired])[i]
        with contextlib.suppress(ProcessLookupError, ValueError):
            ranknice.set_nice(int(pid), nice)

    def _observe_rank(self, i: int, ended: bool) -> RankObservation:
        pid = _read_pid(self.pid_dir / f"rank-{i}.pid")
        if pid is not None:
            if i in self.pids and self.pids[i] != pid:
                self.restarts[i] = self.restarts.get(i, 0) + 1
            if self.pids.get(i) != pid and self.cgroups is not None and not self.cgroups.per_rank:
                # seen for the first time: it started at its launch-time request's nice
                # value; give it the one of its request now (a resize may have come first)
                with contextlib.suppress(OSError):
                    self._set_nice(i, pid)
            self.pids[i] = pid
        if self.cgroups is not None and self.cgroups.per_rank:
            stat = self.cgroups.stat(i)
            usage, nthr, thr_ns = stat.usage_ns, stat.nr_throttled, stat.throttled_ns
            alive = self.cgroups.alive(i)
        else:
            usage = max(_proc_usage_ns(pid), self.last_usage_ns.get(i, 0))
            self.last_usage_ns[i] = usage
            nthr, thr_ns = 0, 0
            alive = pid is not None and _pid_alive(pid)
        if ended:
            phase = RankPhase.SUCCEEDED if self.exit_code in (0, None) else RankPhase.FAILED
        else:
            phase = RankPhase.RUNNING if alive else RankPhase.PENDING
        shim = self.shim.sample(i)
        desired = self.desired[i]
        return RankObservation(
            rank=i,
            phase=phase,
            desired=desired,
            allocated=desired if self.cgroups is not None else None,
            usage_ns=usage,
            nr_throttled=nthr,
            throttled_ns=thr_ns,
            restarts=self.restarts.get(i, 0),
            node=os.uname().nodename,
            pod=self.cgroups.rank(i) if self.cgroups is not None else None,
            resize=self.resizes.get(i),
            compute_ns=shim.compute_ns,
            mpi_ns=shim.mpi_ns,
            duty_window=shim.duty_window,
            wait_mode=shim.wait_mode,
            final=self.finals.get(i) if self.finals else None,
        )


def _read_pid(pid_file: Path) -> str | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return text or None


def _pid_alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _proc_usage_ns(pid: str | None) -> int:
    if pid is None:
        return 0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ValueError, ProcessLookupError, IndexError):
        return 0
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) * 1_000_000_000 // CLK_TCK
