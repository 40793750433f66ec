"""Why a run failed or is held, as codes: the one list every layer uses.

A code is set where the failure is seen (a backend that watches a rank pod vanish, the loop
whose staging failed, the admission that refused a spec) and travels as data beside the
human message: in `SimObservation.failure`, `RunResult.failure`, the store's run row, the
Simulation's status (`reason` and `message`), its Events and the reports. Nothing
downstream recovers a code from the wording of a message.

Later work adds codes here (and only here); the values are CamelCase because they are also
Kubernetes condition and Event reasons.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FailureCode(enum.StrEnum):
    """Why a simulation failed (or was refused, or stopped)."""

    # The case and the spec (seen before anything runs).
    INVALID_SPEC = "InvalidSpec"
    """The submission itself is invalid (ranks, budget, phases, weights, names)."""
    NOT_A_CASE = "NotACase"
    """The case path or tutorial is not an OpenFOAM case."""
    STAGE_FAILED = "StageFailed"
    """Copying, decomposing or preparing the case failed."""
    SOLVER_NOT_ALLOWED = "SolverNotAllowed"
    """The case's application is not in the operator's solver allowlist."""
    HOST_VOLUME_NOT_ALLOWED = "HostVolumeNotAllowed"
    IMAGE_NOT_ALLOWED = "ImageNotAllowed"
    """``spec.image`` is under none of the image prefixes the cluster admin allows."""
    MPI_MISMATCH = "MPIMismatch"
    """The case's solver links one MPI ABI family and ``spec.mpi`` names the other."""
    UNSUPPORTED_MPI = "UnsupportedMPI"
    """The case's solver links no MPI library rankpack can profile (neither Open MPI's
    ``libmpi.so.40`` nor MPICH's ``libmpich.so.12``/``libmpi.so.12``)."""
    CASE_PATH_NOT_ALLOWED = "CasePathNotAllowed"
    CASE_NOT_CONFINED = "CaseNotConfined"
    """The case tries to run code or read files outside itself while it is staged
    (`rankpack.case.confine`)."""
    DOES_NOT_FIT = "DoesNotFit"
    """It can never fit the cluster (or its quota), however long it waits."""
    TOO_MANY_QUEUED = "TooManyQueued"
    """Its namespace has as many Simulations queued as the operator allows
    (``--max-queued-per-namespace``)."""
    OUTSIDE_LIMIT_RANGE = "OutsideLimitRange"
    """A rank's CPU cannot be planned within the namespace's LimitRange (min above max,
    or a rank pod the LimitRanger admission refused)."""
    QUOTA_NEEDS_LIMITS = "QuotaNeedsLimits"
    """The namespace's ResourceQuota limits ``limits.cpu`` and nothing gives rank pods
    (requests only) a CPU limit, so the apiserver refuses every rank pod."""

    # Launching.
    LAUNCH_FAILED = "LaunchFailed"
    """The rank pods, cgroups or the MPI launcher could not be created."""
    CANNOT_START = "CannotStart"
    """A rank pod cannot start (image pull, volume, configuration error)."""
    NOT_RUNNING = "NotRunning"
    """The rank pods were not all running within the launch timeout."""
    UNSCHEDULABLE = "Unschedulable"
    """Not a failure: the scheduler found no node for a rank pod (what the controller
    counted missed a pod it cannot see). The launch is rolled back, its pods deleted, and
    the simulation goes back to its queue with the scheduler's reason; nothing ends with
    this code."""
    QUOTA_EXCEEDED = "QuotaExceeded"
    """Not a failure: a launch (or a grow) the namespace's ResourceQuota does not allow
    now. The simulation waits (held, or handed back to its queue) and runs once the quota
    has room; nothing ends with this code."""

    # While running.
    POD_DELETED = "PodDeleted"
    """A rank pod was deleted by someone else."""
    CONTAINER_EXITED = "ContainerExited"
    """A rank's container or process ended before the run did."""
    OOM_KILLED = "OOMKilled"
    EVICTED = "Evicted"
    NODE_LOST = "NodeLost"
    LAUNCHER_LOST = "LauncherLost"
    """The launcher pod that runs the simulation's mpirun was deleted, evicted or lost with
    its node before mpirun's exit code was written (the Kubernetes backend's pod mode)."""
    RANK_FAILED = "RankFailed"
    """A rank's process was killed or exited non-zero (local backend: by signal or code)."""
    SOLVER_FAILED = "SolverFailed"
    """The solver itself stopped with an error (a FOAM FATAL ERROR, a non-zero exit)."""
    TIMEOUT = "Timeout"
    STOPPED = "Stopped"
    """Stopped on request (the Simulation was deleted, Ctrl-C, the operator shutting down)."""
    LOST_ON_RESTART = "LostOnRestart"
    """It ran under an operator that restarted, and the next one could not adopt it."""

    OTHER = "RunFailed"
    """No more specific code is known."""


@dataclass(frozen=True)
class Failure:
    """A code and the human message that names the pod, the exit code or the error."""

    code: FailureCode
    message: str

    def __str__(self) -> str:
        return self.message
