"""The exit wrapper: ``python -m rankpack.backend.kubernetes.starting.exitwrapper EXIT_FILE
[--lock-fd N] -- MPIRUN ARGS...``.

Host mode only (mpirun on the operator's host, `hostmpirun` starts it): the detached
parent of a simulation's mpirun (not to be confused with the launcher pod, `launcher`): it
runs mpirun and, when mpirun ends, writes its
exit code to EXIT_FILE (on the case volume, atomically). The operator starts simulations
through it so that they outlive the operator: killed at any moment, a restarted operator
adopts the simulation and learns how it ended from EXIT_FILE (`KubernetesBackend.adopt`).
No shell: the argv is passed through unchanged.

The launch marker (`begin`, `launched`, `state`) tells a process adopting a simulation
whether its mpirun was ever started, without a window in which the answer is wrong:
``mpirun.launch`` on the case volume is created and ``flock``-ed *before* mpirun is
spawned, its descriptor is inherited by the exit wrapper and by mpirun (``--lock-fd``), and it
holds ``starting`` until the spawn returned, then the exit wrapper's pid. So: no marker → never
started; the lock held → running; free with ``starting`` → the starter died before the
spawn (start it); free with a pid and no exit code → the exit wrapper and mpirun died.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

from rankpack import untrusted

MARKER = "mpirun.launch"
EXIT = "mpirun.exit"


def begin(rank_dir: Path) -> int | None:
    """Create and lock the marker (``starting``); the descriptor, to be inherited by what
    is spawned and closed by the caller later. None if another process holds it (it
    launched this simulation: do not start a second mpirun)."""
    fd = os.open(rank_dir / MARKER, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, b"starting\n", 0)
    return fd


def launched(fd: int, pid: int) -> None:
    """The spawn returned: the marker names the process that holds the lock from now on."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{pid}\n".encode(), 0)


def state(rank_dir: Path) -> str:
    """ended | running | never | died (see the module doc)."""
    if (rank_dir / EXIT).exists():
        return "ended"
    try:
        fd = os.open(rank_dir / MARKER, os.O_RDONLY)
    except FileNotFoundError:
        return "never"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "running"
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    if (rank_dir / EXIT).exists():  # ended between the two looks
        return "ended"
    return "never" if text in ("", "starting") else "died"


def main(argv: list[str]) -> int:
    lock_fd: int | None = None
    if len(argv) >= 3 and argv[1] == "--lock-fd":
        with contextlib.suppress(ValueError):
            lock_fd = int(argv[2])
        argv = [argv[0], *argv[3:]]
    if len(argv) < 3 or argv[1] != "--":
        print("usage: exitwrapper EXIT_FILE [--lock-fd N] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    exit_file = Path(argv[0])
    # mpirun holds the launch lock too: it stays held while mpirun runs, even if this
    # exit wrapper is killed
    child = subprocess.Popen(argv[2:], pass_fds=(lock_fd,) if lock_fd is not None else ())

    def forward(sig: int, _frame: object) -> None:
        child.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = child.wait()
    write_exit(exit_file, code)
    return code if code >= 0 else 128 - code


def write_exit(path: Path, returncode: int) -> None:
    """mpirun's return code (as `subprocess` gives it) into its exit file, atomically (a
    reader sees no file or the whole code), replacing whatever a rank put at that name and
    never writing through it (`untrusted.write_file`): the run directory is the user's."""
    untrusted.write_file(path, f"{returncode}\n".encode())


def read_exit(path: Path) -> int | None:
    """The code in an exit file; None if there is none, it does not parse, or it is not a
    regular file (a link a rank put there is not followed: `untrusted.read_text`)."""
    try:
        return int(untrusted.read_text(path, 64).strip())
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
