"""Where a case's OpenFOAM runs: the seam staging reaches the Simulation's image through,
and the supervision of a tool's process that both sides of it share.

Staging needs the image's OpenFOAM for five things, `FoamTools`: every tool it runs
(`openfoam.run_tool`: blockMesh, decomposePar, a case's Allrun steps), finding a program
on OpenFOAM's ``PATH`` (`openfoam.check_solver`, `staging.detect_mpi`), listing a
program's libraries (`mpiabi`), and a tutorial by name, found and copied where that
OpenFOAM keeps them. Two implementations:

- `openfoam.HERE`: this process's own environment (the local backend, host mode,
  ``rankpack run``, the CLI): subprocesses, as staging always ran them;
- `foamexec.ExecTools`: a staging pod's sidecar in the Simulation's image, entered with
  ``rankpack-exec`` over the pod's loopback (staging's Python runs in rankpack's image).

It is chosen in one place: the staging sandbox's ``--tools DIR`` (`sandbox.main`) puts an
`ExecTools` in force with `using`; everywhere else `current` is None and
`openfoam.tools` is `openfoam.HERE`.

`run_logged` (a tool in its own process group, its output to a log, stopped with its
group on Ctrl-C, SIGTERM or this process's death) and `run_bounded` (a process whose
output and time are bounded) are the two ways either side runs a process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol


@dataclass(frozen=True)
class Tutorials:
    """Where an OpenFOAM keeps its tutorials and the cases of one name there."""

    root: Path | None
    """None: no tutorials (``missing`` says so)."""
    cases: tuple[Path, ...]
    """The case directories of that name below ``root``, sorted."""
    missing: str
    """The one-line error when ``root`` is None, with what to do."""


@dataclass(frozen=True)
class CopyBounds:
    """What a copied case may hold (`openfoam.copy_case`)."""

    skip: tuple[str, ...]
    """Top-level names starting with one of these are not copied."""
    max_files: int
    max_bytes: int


class FoamTools(Protocol):
    """What staging does with the OpenFOAM of the image a case is staged for."""

    local_files: bool
    """Whether that image's files are this process's (a tutorial's files can be read here)."""

    @property
    def fallback(self) -> FoamTools | None:
        """Where staging's own tools (`openfoam.run_tool`: blockMesh, decomposePar) run
        when that image has none of that name: rankpack's image (an MPI code's image
        without OpenFOAM, whose case is still an OpenFOAM case); None: nowhere else. The
        solver is only ever looked for (`which`) and listed in that image."""
        ...

    def which(self, program: str, cwd: Path | None = None) -> str | None:
        """``program`` on OpenFOAM's ``PATH`` (its path), None if there is none."""
        ...

    def run(self, argv: Sequence[str], cwd: Path, log: BinaryIO) -> int:
        """Run an OpenFOAM tool in ``cwd`` (no shell) under `run_logged`, its output (both
        streams) to ``log``; its exit status."""
        ...

    def listing(self, program: str) -> str:
        """The dynamic loader's listing of ``program`` (`mpiabi.listing_of`'s bounds);
        `UserError` if it cannot be made."""
        ...

    def tutorials(self, name: str) -> Tutorials:
        """The tutorials and the cases named ``name`` among them."""
        ...

    def copy_tutorial(self, source: Path, dest: Path, bounds: CopyBounds) -> int:
        """A tutorial's case (a path of `tutorials`) copied into ``dest`` within
        ``bounds``; the bytes copied. `UserError` (one line) if it may not be."""
        ...


_CURRENT: ContextVar[FoamTools | None] = ContextVar("rankpack_foam_tools", default=None)


def current() -> FoamTools | None:
    """The tools `using` put in force here, None: this process's own (`openfoam.HERE`)."""
    return _CURRENT.get()


@contextlib.contextmanager
def using(tools: FoamTools) -> Iterator[FoamTools]:
    """``tools`` for what runs inside (this thread's context: other threads keep theirs)."""
    token = _CURRENT.set(tools)
    try:
        yield tools
    finally:
        _CURRENT.reset(token)


# -- a tool's process ----------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 5.0
"""How long a tool gets to exit after SIGTERM before it is SIGKILLed."""
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _die_with_parent() -> None:
    """In the forked child: SIGTERM it if rankpack dies, even by SIGKILL, and take back
    the signals the parent held off while starting it (the mask survives exec)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def stop_group(process: subprocess.Popen[bytes], grace_s: float | None = None) -> None:
    """SIGTERM the tool's whole process group, then SIGKILL what is left after ``grace_s``
    (default `STOP_GRACE_S`)."""
    wait_s = STOP_GRACE_S if grace_s is None else grace_s
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait_s)
            # the leader is gone; members it left behind still get the signal next round
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def run_logged(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: BinaryIO) -> int:
    """Run ``argv`` (no shell) in ``cwd`` with ``env``, both output streams to ``log``; its
    exit status.

    The process runs in its own process group with a parent-death signal: Ctrl-C, SIGTERM
    (both arrive here as KeyboardInterrupt) or any other exception stops the whole group,
    and if this process is SIGKILLed the tool gets SIGTERM from the kernel.
    """
    # Ctrl-C/SIGTERM are held off while the child starts: arriving inside Popen they
    # would leave a tool running that nobody stops; pending, they land in the wait.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return process.wait()
    except BaseException:
        # a second Ctrl-C/SIGTERM must not cut the cleanup short
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            stop_group(process)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        raise


def run_bounded(
    argv: Sequence[str], env: Mapping[str, str], timeout_s: float, max_bytes: int
) -> tuple[int | None, bytes]:
    """Runs ``argv`` (no shell); its exit status (None: stopped at ``timeout_s``) and at most
    ``max_bytes`` of its output (stdout and stderr), read as it comes so that no more is
    ever held; a process that writes more, or runs longer, is stopped (a process that wrote
    too much: its status as it was stopped)."""
    deadline = time.monotonic() + timeout_s
    out = bytearray()
    with subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=dict(env), preexec_fn=_die_with_parent,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        try:
            while len(out) < max_bytes and time.monotonic() < deadline:
                left = deadline - time.monotonic()
                if select.select([proc.stdout], [], [], max(0.0, left))[0]:
                    chunk = os.read(proc.stdout.fileno(), max_bytes - len(out))
                    if not chunk:  # end of output: the exit follows
                        return proc.wait(max(0.0, deadline - time.monotonic())), bytes(out)
                    out += chunk
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:  # too long, or too much output
                proc.kill()
        proc.wait()
    return (None if len(out) < max_bytes else proc.returncode), bytes(out)
