"""What both real backends do with ``mpirun``, written once.

The local backend (`rankpack.backend.local`) starts mpirun with a run's ranks in its cgroup on
this machine; the Kubernetes backend (`rankpack.backend.kubernetes`) starts it on this host
with one rank pod per rank. Both then handle mpirun and the files of its ranks the same way,
and this module is that common part:

- `find_mpirun`, `root_env`, `version_of`: which mpirun, what Open MPI needs to run as root,
  and what ``mpirun --version`` says;
- `MpirunProcess`, `Proc`, `stop_group`, `terminate_with_parent`: mpirun in a session of its
  own, ended with the rankpack process that started it, stopped by its process group;
- `shim_dir`, `ShimRecords`: the PMPI shim's live records of a run (counters, wait mode);
- `final_dir`, `prepare_final_dir`, `read_final_records`: the ranks' final records, which
  outlive them (read once a run has ended);
- `LogTail`: the solver log, delivered in whole lines as it grows;
- `exit_failure`: what an ended mpirun's exit status means, as a `Failure` (code, message).

Nothing here knows of cgroups or pods; the backends import this module, never each other.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from rankpack import untrusted
from rankpack.backend.protocol import BackendError, SimSpec
from rankpack.core.actions import WaitMode
from rankpack.core.failures import Failure, FailureCode
from rankpack.errors import UserError
from rankpack.profile.finals import FinalRecord, final_name, read_finals
from rankpack.profile.records import RecordReader, record_path, set_wait_modes

# -- which mpirun --------------------------------------------------------------------------


def find_mpirun(flavour: str = "openmpi") -> str:
    """The mpirun of the MPI the solver was built with; $RANKPACK_MPIRUN overrides.

    ``flavour`` is ``openmpi`` or ``mpich``. Raises UserError (with what to install) if none
    is on PATH.
    """
    explicit = os.environ.get("RANKPACK_MPIRUN")
    if explicit:
        return explicit
    names = (
        ("mpirun.openmpi", "mpirun") if flavour == "openmpi" else ("mpirun.mpich", "mpiexec.hydra")
    )
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise UserError(
        f"no {flavour} mpirun found; install it (apt-get install openmpi-bin) "
        "or set RANKPACK_MPIRUN"
    )


def root_env(flavour: str) -> dict[str, str]:
    """Environment Open MPI's mpirun needs to run as root (empty otherwise: not root, or not
    Open MPI)."""
    if flavour != "openmpi" or os.geteuid() != 0:
        return {}
    return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


VERSION_TIMEOUT_S = 10.0
VERSION_MAX = 64 * 1024


@functools.cache
def version_of(mpirun: str) -> str:
    """What ``MPIRUN --version`` writes (stdout and stderr, at most `VERSION_MAX` bytes,
    within `VERSION_TIMEOUT_S`); empty if it cannot be run. Asked once per path."""
    try:
        proc = subprocess.Popen(
            [mpirun, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    except OSError:
        return ""
    with proc:
        assert proc.stdout is not None
        out = b""
        deadline = time.monotonic() + VERSION_TIMEOUT_S
        while len(out) < VERSION_MAX and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
            chunk = os.read(proc.stdout.fileno(), VERSION_MAX - len(out)) if ready else b""
            if not chunk:
                break
            out += chunk
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    return out.decode("utf-8", errors="replace")


# -- the mpirun process --------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def terminate_with_parent() -> None:
    """In the forked mpirun (a ``preexec_fn``): SIGTERM it if rankpack dies, even by SIGKILL.

    mpirun then takes its ranks (and orteds) down; anything left behind is reaped by the next
    rankpack process (local: `cgroups.reap_stale_runs`).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Proc(Protocol):
    """A running mpirun (an `MpirunProcess`, or a test's fake)."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill_group(self, sig: int) -> None:
        """Send ``sig`` to the process's whole process group (mpirun and what it started)."""
        ...


class MpirunProcess:
    """A process started in a session (and process group) of its own: mpirun, or a launcher
    that runs it. stdin is closed, stdout and stderr go to ``log``.

    With ``with_parent`` (the default) the process is SIGTERMed when this process dies
    (`terminate_with_parent`); a detached exit wrapper that must outlive us passes False.
    Raises OSError if it cannot be started.
    """

    def __init__(
        self,
        argv: Sequence[str],
        cwd: Path,
        env: dict[str, str],
        log: IO[bytes],
        *,
        with_parent: bool = True,
        pass_fds: Sequence[int] = (),
    ) -> None:
        preexec: Callable[[], None] | None = terminate_with_parent if with_parent else None
        self.popen = subprocess.Popen(
            list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec,
            pass_fds=tuple(pass_fds),
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout)

    def kill_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)


def stop_group(process: Proc, grace_s: float = 5.0) -> None:
    """SIGTERM the process's group; SIGKILL it if it has not ended after ``grace_s``.

    Returns when it has ended, or after a second ``grace_s`` (a process stuck in the kernel
    is then left to the caller's cleanup: cgroups, pods). Does nothing if it has ended.
    """
    if process.poll() is not None:
        return
    process.kill_group(signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)


# -- what it ended with --------------------------------------------------------------------

_SIGNAL_BASE = 128
"""mpirun exits with 128 + n when a rank was killed by signal n (Open MPI; the shell's
convention)."""


def exit_failure(code: int | None, *, stopped: bool = False) -> Failure | None:
    """Why a simulation whose mpirun ended with ``code`` failed; None if it succeeded.

    ``code`` is the return code as `subprocess` gives it (negative: mpirun itself was killed
    by that signal; None: unknown, e.g. its launcher vanished). ``stopped``: the backend
    stopped it on request, whatever the code.

    - stopped: STOPPED;
    - 0: success (None);
    - 1..128: SOLVER_FAILED (the solver exited with an error, e.g. FOAM FATAL ERROR);
    - above 128 (a rank killed by signal code - 128) or negative (mpirun killed, its ranks
      with it): RANK_FAILED;
    - None: OTHER.
    """
    if stopped:
        return Failure(FailureCode.STOPPED, "stopped")
    if code is None:
        return Failure(FailureCode.OTHER, "ended with an unknown status")
    if code == 0:
        return None
    if code < 0:
        return Failure(FailureCode.RANK_FAILED, f"mpirun was killed by signal {-code}")
    code_of = FailureCode.RANK_FAILED if code > _SIGNAL_BASE else FailureCode.SOLVER_FAILED
    return Failure(code_of, f"the MPI job exited with code {code}")


# -- the solver log ------------------------------------------------------------------------


@dataclass
class LogTail:
    """The part of a solver log not delivered yet (read from ``offset`` on)."""

    path: Path
    offset: int = 0
    """Bytes of the log delivered so far (set to its size to skip what is there)."""

    def read(self, *, ended: bool) -> str:
        """The log's new whole lines (at most 8 MiB); once ``ended``, also a last partial
        line. Empty if the log does not exist (yet)."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read(8 << 20)
        except FileNotFoundError:
            return ""
        # only whole lines while it runs: a partial last line waits for the next call
        cut = chunk.rfind(b"\n") + 1 if not ended else len(chunk)
        self.offset += cut
        return chunk[:cut].decode("utf-8", errors="replace")


# -- the shim's live records -----------------------------------------------------------------


def shim_dir(case_dir: Path) -> Path:
    """Where the shim's live records of a local run go (``<case>/.rankpack/shim``). The
    Kubernetes backend's ranks write theirs into their pods' own volumes instead
    (`rankpack.backend.kubernetes.nodes.nodereader`)."""
    return case_dir / ".rankpack" / "shim"


@dataclass(frozen=True)
class ShimSample:
    """What a rank's shim record says now (all None without the shim or before its first
    record)."""

    compute_ns: int | None = None
    """Cumulative wall time outside MPI."""
    mpi_ns: int | None = None
    """Cumulative wall time inside MPI."""
    duty_window: float | None = None
    """Duty cycle over the shim's latest window."""
    wait_mode: str | None = None
    """The wait mode the rank used at its latest wait."""


@dataclass
class ShimRecords:
    """The shim's live records of one simulation's ranks (none if launched without the
    shim). Not thread-safe: callers read it under their own lock if they have threads."""

    spec: SimSpec
    readers: list[RecordReader] = field(default_factory=list)

    @classmethod
    def of(cls, spec: SimSpec) -> ShimRecords:
        """Readers for ranks 0..n-1 if ``spec`` runs with the shim (files may appear later)."""
        if spec.shim is None:
            return cls(spec)
        live = shim_dir(spec.case_dir)
        return cls(spec, [RecordReader(record_path(live, r)) for r in range(len(spec.ranks))])

    def sample(self, rank: int) -> ShimSample:
        """Rank ``rank``'s latest record; an empty sample if there is none (yet) or it cannot
        be read (a torn or vanished file is not an error: the next sample may succeed)."""
        if rank >= len(self.readers):
            return ShimSample()
        with contextlib.suppress(UserError, OSError, ValueError):
            rec = self.readers[rank].snapshot()
            if rec is not None:
                return ShimSample(rec.compute_ns, rec.mpi_ns, rec.window_duty, rec.wait_mode)
        return ShimSample()

    def set_wait_mode(self, mode: WaitMode) -> None:
        """Ask every rank to wait in ``mode`` from its next wait on (the control word in each
        rank's record). BackendError for a simulation without the shim, an unknown mode, or
        a rank whose record is not published yet."""
        if self.spec.shim is None:
            raise BackendError(
                f"simulation {self.spec.sim_id} runs without the shim: no wait mode to set"
            )
        try:
            set_wait_modes(shim_dir(self.spec.case_dir), len(self.spec.ranks), mode)
        except UserError as exc:
            raise BackendError(str(exc)) from exc

    def close(self) -> None:
        """Unmap every record (idempotent)."""
        for reader in self.readers:
            with contextlib.suppress(OSError, UserError):
                reader.close()


# -- the shim's final records ----------------------------------------------------------------


def final_dir(case_dir: Path) -> Path:
    """Where each rank's shim writes its final record when it ends
    (``<case>/.rankpack/final``, `rankpack.profile.finals`): in the run directory, which
    outlives the ranks (on Kubernetes the case volume, which the operator mounts too; the
    live records are in the rank pods' own volumes and go with them)."""
    return case_dir / ".rankpack" / "final"


def prepare_final_dir(case_dir: Path, n_ranks: int) -> Path:
    """`final_dir`, made this process's own if something else stood there
    (`untrusted.own_dir`), without the final records an earlier run in this directory left
    for ranks ``0..n_ranks-1`` (they are not this run's); returns it. OSError if it cannot
    be made."""
    directory = untrusted.own_dir(final_dir(case_dir))
    for rank in range(n_ranks):
        (directory / final_name(rank)).unlink(missing_ok=True)
    return directory


def read_final_records(spec: SimSpec) -> dict[int, FinalRecord]:
    """The final records of a simulation's ranks, by rank (none without the shim, and none
    for a rank that wrote none or an invalid one): read by a backend once it sees the
    simulation end, then kept (the files do not change after)."""
    if spec.shim is None:
        return {}
    return read_finals(final_dir(spec.case_dir), len(spec.ranks))
