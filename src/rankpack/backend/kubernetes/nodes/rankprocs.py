"""Which host process is a rank of a group pod: the pid its pod gives, found in its cgroup.

A group pod (decision 0012) holds several ranks of one simulation in one container, so its
cgroup counts them together: a rank's own CPU time and its nice value are its process's.
Each rank's launcher writes its pid as the pod sees it (``nodereader.PID_FILE`` in the pod's
``rankpack-live`` volume); the node reader reads that file and asks `RankProcesses` for the
host process it names. Only the processes of that pod's cgroup are candidates (every
``cgroup.procs`` at or below the pod-level cgroup directory): the one whose
``/proc/<p>/status`` ``NSpid:`` line ends with the pod's pid. A forged pid file can at worst
name another process of its own pod, never one of another pod or of the node. Two matches
(two pid namespaces in one pod giving the same number) are no match.

The pids in ``cgroup.procs`` are those of the reader's pid namespace, so the node agent
runs with ``hostPID`` (its manifests) and reads the host's ``/proc``. A resolution is kept
per (pod uid, rank) and checked cheaply on each use (the same pod pid, the same host
process: its start time, field 22 of ``/proc/<p>/stat``); a scan reads at most
`MAX_CGROUP_DIRS` directories and `MAX_PROCS` processes. Called by `nodereader.NodeReader`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROC_ROOT = Path("/proc")
MAX_CGROUP_DIRS = 128
"""The most cgroup directories read at and below one pod's (its containers', nested)."""
MAX_PROCS = 4096
"""The most processes of one pod looked at in one scan."""
MAX_CACHED = 4096
"""The most (pod, rank) resolutions kept (the oldest go first)."""
_MAX_PROC_FILE = 4096
_MAX_PROCS_FILE = 1 << 16


@dataclass(frozen=True)
class ProcStat:
    """What ``/proc/<pid>/stat`` says of a process, for a rank's reading."""

    cpu_ticks: int
    """utime + stime of the whole process (every thread), in clock ticks."""
    starttime: int
    """When it started, clock ticks after boot: with its pid, the process's identity."""


@dataclass(frozen=True)
class RankProcess:
    """A rank's host process."""

    host_pid: int
    stat: ProcStat


def parse_proc_stat(text: bytes) -> ProcStat | None:
    """``/proc/<pid>/stat``'s CPU ticks and start time (None: not that file's shape). The
    command name (field 2) may hold spaces and parentheses: fields are counted after the
    last ``)``."""
    fields = text[text.rfind(b")") + 1 :].split()
    try:  # field N of stat(5) is fields[N - 3] here (field 3, the state, is fields[0])
        return ProcStat(int(fields[11]) + int(fields[12]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def parse_ns_pid(text: bytes) -> int | None:
    """The last field of ``/proc/<pid>/status``'s ``NSpid:`` line: the process's pid in its
    innermost pid namespace (its container's); None without one."""
    for line in text.splitlines():
        if line.startswith(b"NSpid:"):
            fields = line.split()[1:]
            return int(fields[-1]) if fields and fields[-1].isdigit() else None
    return None


def _read(path: Path, limit: int) -> bytes | None:
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read(limit)
    except (OSError, ValueError):  # gone, or not readable
        return None


def cgroup_pids(pod_dir: Path) -> list[int]:
    """The pids in every ``cgroup.procs`` at or below ``pod_dir`` (bounded; links are not
    followed)."""
    pids: list[int] = []
    for n, (here, dirs, _) in enumerate(os.walk(pod_dir)):
        if n >= MAX_CGROUP_DIRS:
            break
        dirs.sort()
        data = _read(Path(here) / "cgroup.procs", _MAX_PROCS_FILE) or b""
        pids.extend(int(p) for p in data.split() if p.isdigit())
        if len(pids) >= MAX_PROCS:
            return pids[:MAX_PROCS]
    return pids


class RankProcesses:
    """Host processes of ranks, from the pids their pods give (see the module)."""

    def __init__(self, proc_root: Path = PROC_ROOT) -> None:
        self.proc_root = proc_root
        self._known: dict[tuple[str, int], tuple[int, int, int]] = {}
        """(pod uid, rank) -> (pod pid, host pid, start time)."""
        self._lock = threading.Lock()

    def stat(self, host_pid: int) -> ProcStat | None:
        """The process's stat now (None: gone)."""
        data = _read(self.proc_root / str(host_pid) / "stat", _MAX_PROC_FILE)
        return None if data is None else parse_proc_stat(data)

    def ns_pid(self, host_pid: int) -> int | None:
        data = _read(self.proc_root / str(host_pid) / "status", _MAX_PROC_FILE)
        return None if data is None else parse_ns_pid(data)

    def resolve(
        self, uid: str, pod_pids: Mapping[int, int], pod_dir: Path
    ) -> dict[int, RankProcess]:
        """The host process of each rank of pod ``uid`` whose pod pid is given (rank -> pid
        as the pod sees it), among the processes of its cgroup ``pod_dir``; a rank whose
        process is not there (not started, ended, or a pid no process of the pod has) is
        left out. One scan of the pod's processes for all the ranks not known already."""
        found: dict[int, RankProcess] = {}
        unknown: dict[int, int] = {}
        for rank, pod_pid in pod_pids.items():
            with self._lock:
                known = self._known.get((uid, rank))
            if known is not None and known[0] == pod_pid:
                stat = self.stat(known[1])
                if stat is not None and stat.starttime == known[2]:
                    found[rank] = RankProcess(known[1], stat)
                    continue
            unknown[rank] = pod_pid
        if unknown:
            found.update(self._scan(uid, unknown, pod_dir))
        return found

    def _scan(self, uid: str, unknown: Mapping[int, int], pod_dir: Path) -> dict[int, RankProcess]:
        wanted = {pid: rank for rank, pid in unknown.items()}
        matches: dict[int, list[int]] = {}
        for host_pid in cgroup_pids(pod_dir):
            ns_pid = self.ns_pid(host_pid)
            if ns_pid in wanted:
                matches.setdefault(wanted[ns_pid], []).append(host_pid)
        found: dict[int, RankProcess] = {}
        for rank, hosts in matches.items():
            stat = self.stat(hosts[0]) if len(set(hosts)) == 1 else None
            if stat is None:  # ambiguous, or ended meanwhile
                continue
            found[rank] = RankProcess(hosts[0], stat)
            with self._lock:
                self._known.pop((uid, rank), None)
                self._known[(uid, rank)] = (unknown[rank], hosts[0], stat.starttime)
                while len(self._known) > MAX_CACHED:
                    del self._known[next(iter(self._known))]
        return found
