"""Starting the dev cluster's daemons detached, finding them again, stopping them.

`rankpack.devcluster.lifecycle` starts each component with `start` (argv list, own session,
output to ``<state>/logs/<name>.log``) and records ``pid starttime`` in
``<state>/pids/<name>.pid``; the start time (from /proc) guards against a recycled pid, so
`down` in a later process never signals a stranger. Zombies count as gone (the parent that
started them may still be alive, e.g. a pytest session).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 of /proc/PID/stat


def running(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


# Run by a short-lived helper interpreter: fork, and in the child start a new session, join
# the given cgroups (each a cgroup.procs file), redirect output and exec the daemon; the
# helper prints the pid and exits, so the daemon is nobody's child but init's and outlives
# whoever ran `up` (a shell, a pytest session).
_DAEMONIZE = """
import os, sys
log, cgroups, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
pid = os.fork()
if pid == 0:
    try:
        os.setsid()
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, 65536)
        for procs in filter(None, cgroups.split(os.pathsep)):
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        os.execv(argv[0], argv)
    except BaseException as exc:
        print(f"rankpack: cannot start {argv[0]}: {exc}", file=sys.stderr, flush=True)
    finally:
        os._exit(127)
print(pid, flush=True)
"""


def start(
    argv: list[str],
    log: Path,
    pid_file: Path,
    env: dict[str, str] | None = None,
    cgroups: list[Path] | None = None,
) -> int:
    """Start `argv` (argv[0] an absolute path) detached, in `cgroups` (``cgroup.procs``
    files) if given; record and return its pid."""
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    joined = os.pathsep.join(str(p) for p in cgroups or [])
    helper = subprocess.run(
        [sys.executable, "-c", _DAEMONIZE, str(log), joined, *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env=env,
    )
    pid = int(helper.stdout.split()[0])
    pid_file.write_text(f"{pid} {start_time(pid) or 0}\n")
    return pid


def daemon_env() -> dict[str, str]:
    """The environment the daemons start with: this one without ``KUBE*``/``GO*``
    variables, the sbin directories on ``PATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "GO"))}
    path = env.get("PATH", "/usr/bin:/bin")
    env["PATH"] = ":".join(
        dict.fromkeys(["/usr/local/sbin", "/usr/sbin", "/sbin", *path.split(":")])
    )
    return env


def reap(pids: list[int]) -> None:
    """Collect the exit status of those of ``pids`` that are our children (no zombies)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def read_pid(pid_file: Path) -> int | None:
    """The recorded pid if that very process still runs, else None."""
    try:
        pid_text, started = pid_file.read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    if not running(pid):
        return None
    if int(started) and start_time(pid) != int(started):
        return None
    return pid


def stop(pids: list[int], timeout_s: float = 15) -> list[int]:
    """SIGTERM, wait (bounded), SIGKILL. Returns the pids still running afterwards."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if running(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if running(p)]


def shims_of(socket: Path) -> list[int]:
    """containerd-shim processes serving our containerd (they outlive it by design)."""
    found = []
    for pid in all_pids():
        argv = cmdline(pid)
        if argv and os.path.basename(argv[0]).startswith("containerd-shim") and str(socket) in argv:
            found.append(pid)
    return found


def by_name(names: set[str]) -> list[tuple[int, str]]:
    """Running processes whose executable name is one of `names` (to detect other clusters)."""
    found = []
    for pid in all_pids():
        argv = cmdline(pid)
        if argv and os.path.basename(argv[0]) in names and running(pid):
            found.append((pid, os.path.basename(argv[0])))
    return found
