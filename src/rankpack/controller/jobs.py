"""Where the control loop takes its work from: job sources.

A `Job` is one submission waiting in a queue. The loop asks its `JobSource` for the pending
jobs each tick, claims the one the policy launches, and tells the source when it started,
is held, handed back (a launch refused for quota) and ended (with its run's result).
`OneJob` is `rankpack run`'s queue of one (in memory); `StoreQueue` is
the database's queue (`rankpack submit`, `rankpack multiplex`); the operator's queue of
Simulation objects lives in `rankpack.operator.queue`. `Adopted` is what a source knows of
a simulation an earlier controller process launched (`ControlLoop.adopt`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rankpack.backend.protocol import StagedCase
from rankpack.core.failures import Failure, FailureCode
from rankpack.core.results import RunResult
from rankpack.plan.submission import Submission
from rankpack.store import Store


@dataclass(frozen=True)
class Resume:
    """A job whose run a lost node cut short (``NodeLost``): requeued to run again from its
    case's last complete write instead of from the start (`StageSpec.resume`)."""

    staged: StagedCase
    """The case as it was staged (its run directory holds what was written)."""
    iterations_at_loss: int
    """Time steps the solver had done when the node was lost."""
    lost_run_id: int | None = None
    """The run the node loss ended (recorded ``requeued``, code ``NodeLost``)."""
    why: str = ""
    losses: int = 1
    """Lost nodes this job has met so far."""
    iterations_lost: int = 0
    """Time steps run and lost over its earlier losses (done again after them)."""

    def done_at_loss(self, staged: StagedCase) -> int:
        """Time steps known done at the loss: the last observed, or the write it resumes
        from if that is later (observations lag behind the solver: a write at step N
        proves N were done)."""
        return max(self.iterations_at_loss, staged.start_iterations)

    def lost_now(self, staged: StagedCase) -> int:
        """Time steps lost this time: done at the loss but after the write it resumes from
        (``staged``: the case made to resume, `StagedCase.start_iterations`)."""
        return max(0, self.iterations_at_loss - staged.start_iterations)


@dataclass(frozen=True)
class Job:
    queue_id: int
    submission: Submission
    namespace: str | None = None
    """Where it runs, for a backend that places in several (the operator serving several
    Kubernetes namespaces, `rankpack.operator.tenancy`); None: the backend's own."""
    runs_root: Path | None = None
    """Its run directory goes below this instead of the loop's ``runs_root`` (run directories
    kept apart per namespace)."""
    volume: str | None = None
    """Where its run directory lives in its rank pods when its submission names no volume,
    instead of the loop's ``volume`` (its namespace's own claim)."""
    resume: Resume | None = None
    """Its run was cut short by a lost node: it runs again from its last write."""
    case_root: str | None = None
    """The admin's case root its case path was admitted under (a staging sandbox mounts that
    and nothing else of the user's files); None: a tutorial name, or no roots."""


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

    def finished(
        self,
        job: Job,
        status: str,
        message: str = "",
        failure: FailureCode | None = None,
        result: RunResult | None = None,
    ) -> None:
        """The job ended (``message`` and ``failure``, its code: why, when it failed before
        it had a run; ``result``: its run's result, recorded, when it had one, whose own
        code is its ``failure``)."""
        ...

    def heartbeat(self, jobs: Sequence[Job]) -> None: ...

    def held(self, job: Job, code: str, reason: str) -> None:
        """The job waits in the queue for this reason (the policy's ``launch-held`` code)."""
        ...

    def withdrawn(self) -> set[int]:
        """Queue ids of the jobs whose owner took them back while this loop held them (a
        deleted Simulation): the loop stops and releases them, and writes nothing back."""
        ...

    def requeued(self, job: Job, why: Failure) -> None:
        """The job was claimed and launched, and the launch was refused for a reason that
        passes (``why.code``: `FailureCode.QUOTA_EXCEEDED`) with nothing left of it, or its
        run was cut short by a lost node (`FailureCode.NODE_LOST`; ``job.resume`` says what
        to resume from): it is pending again (claimable, not started), waiting for the
        reason to pass."""
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

    def finished(
        self,
        job: Job,
        status: str,
        message: str = "",
        failure: FailureCode | None = None,
        result: RunResult | None = None,
    ) -> None:
        pass

    def heartbeat(self, jobs: Sequence[Job]) -> None:
        pass

    def held(self, job: Job, code: str, reason: str) -> None:
        pass

    def withdrawn(self) -> set[int]:
        return set()

    def requeued(self, job: Job, why: Failure) -> None:
        self.job = job  # (with what to resume from, after a lost node)
        # `rankpack run` waits, as it does when the quota has no room at plan time: the
        # loop launches it again once there is room (Ctrl-C stops it; `rankpack events`
        # says why it waits)
        self.taken = False


class StoreQueue:
    """The database's queue (`rankpack submit`), claimed with leases."""

    def __init__(self, store: Store, multiplex_id: int | None) -> None:
        self.store = store
        self.multiplex_id = multiplex_id
        self.resumes: dict[int, Resume] = {}
        """Queue id -> what to resume from (a lost node's requeue, in this session)."""

    def pending(self) -> list[Job]:
        return [Job(q.id, Submission.from_json(q.options), resume=self.resumes.get(q.id))
                for q in self.store.queue()]  # fmt: skip

    def claim(self, job: Job) -> bool:
        return self.store.claim(job.queue_id, self.multiplex_id)

    def started(self, job: Job, run_id: int, sim_id: str, staged: StagedCase) -> None:
        self.store.set_queue_run(job.queue_id, run_id)

    def finished(
        self,
        job: Job,
        status: str,
        message: str = "",
        failure: FailureCode | None = None,
        result: RunResult | None = None,
    ) -> None:
        self.store.finish_queue(job.queue_id, status)

    def heartbeat(self, jobs: Sequence[Job]) -> None:
        self.store.heartbeat([j.queue_id for j in jobs])

    def held(self, job: Job, code: str, reason: str) -> None:
        pass  # the launch-held event says it (`rankpack events`)

    def withdrawn(self) -> set[int]:
        return set()  # an entry is taken back only once it ended (`rankpack queue`)

    def requeued(self, job: Job, why: Failure) -> None:
        if job.resume is not None:
            self.resumes[job.queue_id] = job.resume
        self.store.release_claim(job.queue_id)  # the launch-requeued event says why


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
