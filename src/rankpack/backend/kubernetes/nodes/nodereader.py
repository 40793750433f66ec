"""What a node knows of its rank pods: their cgroup counters and the shim's live records.

The one node-side reader (decision 0010). `rankpack node-agent` uses it in its DaemonSet pod
(through host mounts of the kubelet's pods directory and of ``/sys/fs/cgroup``) to serve
``/v1/ranks``; the Kubernetes backend uses it in-process when it runs on the rank pods' node
(``KubernetesConfig.readings == "node"``: the single-node dev cluster, `readings`). Given a
rank pod as the API shows it (uid, namespace, labels, ``status.qosClass``), `NodeReader`
returns a typed `NodeRankReading` and sets the rank's wait mode.

Cgroup layouts (cgroupfs driver, as the kubelet names them; ``<pods>`` is the node's pods
cgroup, ``kubepods`` unless the kubelet has a ``--cgroup-root`` of its own):

- v1: ``<root>/cpuacct/<pods>/<qos>/pod<UID>/cpuacct.usage`` and
  ``<root>/cpu/<pods>/<qos>/pod<UID>/cpu.stat`` (``cpu,cpuacct`` when co-mounted); no PSI;
- v2: ``<root>/<pods>/<qos>/pod<UID>/cpu.stat`` (``usage_usec``, throttling) and
  ``cpu.pressure`` (PSI, where the kernel has it);

where ``<qos>`` is ``burstable`` or ``besteffort``, and Guaranteed pods sit right below
``<pods>``. The pod-level cgroup includes every container of the pod.

The shim's record of rank ``r`` is ``rank-<r>.rec`` in the pod's own ``emptyDir``
``rankpack-live`` (mounted at ``/var/run/rankpack`` in the rank container), which the node
sees at ``<kubelet root>/pods/<UID>/volumes/kubernetes.io~empty-dir/rankpack-live/``. That
directory is written by the workload, so it is untrusted: every path component below the
kubelet's pods directory is opened with ``O_NOFOLLOW`` (a symbolic link is never followed
out of the pod's directory), only a regular file is read (a FIFO cannot block the reader:
``O_NONBLOCK``), reads are ``pread`` copies bounded in tries (never a mapping a truncation
could fault, never a wait on a torn record), and pod uids and ranks that are not a UUID and
a number are refused before any path is built.

A pod holds one rank (``RANK_LABEL``, the pods of runs started before rank groups) or a
rank group (decision 0012: ``GROUP_LABEL``, its ranks in ``RANKS_ANNOTATION``); `rank_pods`
gives one `RankPod` per rank either way. A group pod's cgroup is its ranks' together, so a
rank's CPU time is its own process's and its share is its nice value, which `NodeReader`
sets: each rank's launcher writes its pid as the pod sees it into `PID_FILE` beside its
record (read with the same discipline, at most `MAX_PID_FILE` bytes), and `rankprocs` finds
the host process of the pod's cgroup that has that pid in its pod.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankpack.backend.cgroups import cpu_stat_v1, cpu_stat_v2
from rankpack.backend.kubernetes.nodes.rankprocs import PROC_ROOT, RankProcess, RankProcesses
from rankpack.backend.kubernetes.objects.builders import LIVE_VOLUME, RANK_LABEL, SIM_LABEL
from rankpack.backend.kubernetes.objects.grouppods import GROUP_LABEL, RANKS_ANNOTATION
from rankpack.backend.kubernetes.objects.groups import parse_ranks_annotation
from rankpack.backend.mpirun import ShimSample
from rankpack.backend.ranknice import MAX_NICE, set_nice
from rankpack.errors import UserError
from rankpack.profile.records import set_wait_mode_fd, snapshot_fd

Obj = dict[str, Any]

KUBELET_ROOT = Path("/var/lib/kubelet")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PODS_CGROUP = "kubepods"
_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_RANK = re.compile(r"^[0-9]{1,6}$")
_QOS_DIRS = {"Guaranteed": ("",), "Burstable": ("burstable",), "BestEffort": ("besteffort",)}
_ANY_QOS = ("burstable", "", "besteffort")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_RECORD_TRIES = 100
PID_FILE = "rank-{rank}.pid"
"""A rank's pid as its pod sees it, decimal and a newline, in the pod's ``rankpack-live``
volume (the rank's launcher writes it with its ``$$``, then execs the solver)."""
MAX_PID_FILE = 32
"""The most of a pid file read (a larger one is not a pid file)."""
_PID = re.compile(rb"[0-9]{1,7}\n?")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class NotPublished(UserError):
    """A rank's record does not exist or is not published yet (try again later)."""


@dataclass(frozen=True)
class CpuCounters:
    """A pod's cumulative CPU counters (cgroup)."""

    usage_ns: int
    nr_throttled: int = 0
    throttled_ns: int = 0


@dataclass(frozen=True)
class Pressure:
    """The pod cgroup's CPU pressure (PSI, cgroup v2 ``cpu.pressure``)."""

    some_avg10: float
    """Percent of the last 10 s in which some task of the pod waited for a CPU."""
    some_total_us: int
    """Cumulative time some task waited, microseconds."""
    full_avg10: float | None = None
    """The same for all tasks at once (None: the kernel reports no ``full`` line)."""
    full_total_us: int | None = None


@dataclass(frozen=True)
class NodeRankReading:
    """What the node says of one rank now."""

    cpu: CpuCounters | None
    """None: its pod's cgroup is not there (not started yet, or gone); for a rank of a group
    pod, also while its process is not known (no pid file yet, or no such process)."""
    psi: Pressure | None = None
    """The pod's; None: cgroup v1, or a kernel without PSI."""
    shim: ShimSample | None = None
    """None: no published record (no shim, or before MPI_Init)."""


@dataclass(frozen=True)
class RankPod:
    """A rank's identity in its pod, checked (what paths are built from)."""

    namespace: str
    name: str
    uid: str
    sim: str
    rank: int
    qos: str
    node: str
    group: bool = False
    """Its pod is a group pod (its CPU time is its process's, not the pod's cgroup's)."""


def pid_file_name(rank: int) -> str:
    """`PID_FILE` of ``rank``."""
    return PID_FILE.format(rank=rank)


def holds_ranks(pod: Obj) -> bool:
    """The pod is a rank pod or a group pod (by its labels; a launcher pod is neither)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return RANK_LABEL in labels or GROUP_LABEL in labels


def rank_pods(pod: Obj) -> list[RankPod]:
    """The ranks a pod holds: a rank pod's one, a group pod's (its `RANKS_ANNOTATION`) in
    order. ValueError if its uid is not a UUID, its rank label not a number, its annotation
    not a run of ranks, or it has both labels or neither (nothing is read for such a pod)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    uid = str(meta.get("uid") or "")
    if not _UID.match(uid):
        raise ValueError(f"pod uid {uid[:64]!r} is not a UUID")
    if (RANK_LABEL in labels) == (GROUP_LABEL in labels):
        raise ValueError(f"pod has {'both' if RANK_LABEL in labels else 'neither'} of "
                         f"{RANK_LABEL} and {GROUP_LABEL}")  # fmt: skip
    if GROUP_LABEL in labels:
        annotation = (meta.get("annotations") or {}).get(RANKS_ANNOTATION)
        ranks = parse_ranks_annotation(str(annotation or ""))
    else:
        rank = str(labels.get(RANK_LABEL) or "")
        if not _RANK.match(rank):
            raise ValueError(f"rank label {rank[:64]!r} is not a number")
        ranks = (int(rank),)
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    sim = str(labels.get(SIM_LABEL) or "")
    qos = str((pod.get("status") or {}).get("qosClass") or "")
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    group = GROUP_LABEL in labels
    return [RankPod(namespace, name, uid, sim, r, qos, node, group) for r in ranks]


def one_rank(pod: Obj, rank: int | None) -> RankPod:
    """Rank ``rank`` of the pod (None: a one-rank pod's own); ValueError if the pod does not
    hold it (or is not a rank or group pod: `rank_pods`)."""
    ranks = rank_pods(pod)
    if rank is None and len(ranks) == 1 and not ranks[0].group:
        return ranks[0]
    for who in ranks:
        if who.rank == rank:
            return who
    raise ValueError(f"pod {ranks[0].name} holds ranks {ranks[0].rank}-{ranks[-1].rank}, "
                     f"not {'a rank given' if rank is None else rank}")  # fmt: skip


# -- cgroups --------------------------------------------------------------------------------


def check_pods_cgroup(path: str) -> str:
    """The pods cgroup as a relative path below the cgroup root (``kubepods``,
    ``node-b/kubepods``); UserError if it is absolute or climbs out."""
    parts = [p for p in path.strip("/").split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise UserError(f"the pods cgroup '{path}' must be a path below the cgroup root")
    return "/".join(parts)


def own_pods_cgroup(proc_cgroup: str) -> str | None:
    """The pods cgroup of the pod this process runs in, from ``/proc/self/cgroup``'s text:
    the path up to and including its ``kubepods`` component (``kubepods``,
    ``rankpack-node-1/kubepods``); None when no line has one (not in a pod, or a cgroup
    namespace hides the path)."""
    for line in proc_cgroup.splitlines():
        path = line.split(":", 2)[-1]
        parts = [p for p in path.split("/") if p]
        if PODS_CGROUP in parts:
            return "/".join(parts[: parts.index(PODS_CGROUP) + 1])
    return None


def resolve_pods_cgroup(spec: str, proc_cgroup: Path = Path("/proc/self/cgroup")) -> str:
    """``--pods-cgroup``: ``auto`` is this pod's own pods cgroup (the node agent, whose pod
    sits below its node's pods cgroup: ``kubepods``, or ``<root>/kubepods`` for a kubelet
    with a ``--cgroup-root``, several nodes on one machine), else ``kubepods``; any other
    value is checked by `check_pods_cgroup`."""
    if spec != "auto":
        return check_pods_cgroup(spec)
    try:
        found = own_pods_cgroup(proc_cgroup.read_text())
    except OSError:
        found = None
    return check_pods_cgroup(found or PODS_CGROUP)


class NodeCgroups:
    """The pod-level cgroups of this node's pods (v1 or v2, cgroupfs driver)."""

    def __init__(self, root: Path = CGROUP_ROOT, pods_cgroup: str = PODS_CGROUP) -> None:
        self.root = root
        self.pods = check_pods_cgroup(pods_cgroup)
        self.v2 = (root / "cgroup.controllers").is_file()
        self.cpuacct = self._hierarchy(("cpuacct", "cpu,cpuacct"))
        self.cpu = self._hierarchy(("cpu", "cpu,cpuacct"))

    def _hierarchy(self, names: Sequence[str]) -> Path | None:
        return next((self.root / d for d in names if (self.root / d / self.pods).is_dir()), None)

    @property
    def available(self) -> bool:
        """The node's pods cgroup is here (this process sees the node's cgroups)."""
        if self.v2:
            return (self.root / self.pods).is_dir()
        return self.cpuacct is not None

    def _pod_dir(self, base: Path, uid: str, qos: str) -> Path | None:
        for q in _QOS_DIRS.get(qos, _ANY_QOS):
            d = base / self.pods / q / f"pod{uid}" if q else base / self.pods / f"pod{uid}"
            if d.is_dir():
                return d
        return None

    def pod_dir(self, uid: str, qos: str = "") -> Path | None:
        """The pod-level cgroup directory whose ``cgroup.procs`` (and its containers') list
        the pod's processes (v1: the ``cpuacct`` hierarchy's); None: not there."""
        base = self.root if self.v2 else (self.cpuacct or self.cpu)
        return None if base is None else self._pod_dir(base, uid, qos)

    def read(self, uid: str, qos: str = "") -> tuple[CpuCounters | None, Pressure | None]:
        """The pod's counters and pressure (``uid`` checked by the caller: `rank_pods`)."""
        try:
            if self.v2:
                d = self._pod_dir(self.root, uid, qos)
                if d is None:
                    return None, None
                st = cpu_stat_v2((d / "cpu.stat").read_text())
                counters = CpuCounters(st.usage_ns, st.nr_throttled, st.throttled_ns)
                return counters, _pressure(d / "cpu.pressure")
            if self.cpuacct is None:
                return None, None
            d = self._pod_dir(self.cpuacct, uid, qos)
            if d is None:
                return None, None
            usage = (d / "cpuacct.usage").read_text()
            cpu_dir = self._pod_dir(self.cpu, uid, qos) if self.cpu else None
            stat = (cpu_dir / "cpu.stat").read_text() if cpu_dir is not None else ""
            st = cpu_stat_v1(stat, usage)
            return CpuCounters(st.usage_ns, st.nr_throttled, st.throttled_ns), None
        except (OSError, ValueError):  # the pod went away mid-read
            return None, None


def parse_pressure(text: str) -> Pressure | None:
    """``cpu.pressure``: ``some avg10=.. avg60=.. avg300=.. total=..`` (+ a ``full`` line)."""
    lines: dict[str, tuple[float, int]] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        fields = dict(f.partition("=")[::2] for f in rest.split())
        try:
            lines[kind] = (float(fields["avg10"]), int(fields["total"]))
        except (KeyError, ValueError):
            continue
    if "some" not in lines:
        return None
    full = lines.get("full")
    return Pressure(lines["some"][0], lines["some"][1], full[0] if full else None,
                    full[1] if full else None)  # fmt: skip


def _pressure(path: Path) -> Pressure | None:
    try:
        return parse_pressure(path.read_text())
    except OSError:  # v1, no PSI in this kernel (EOPNOTSUPP), or gone
        return None


# -- the node reader ------------------------------------------------------------------------


class NodeReader:
    """Readings of this node's rank and group pods; their ranks' wait modes and nice values."""

    def __init__(
        self,
        kubelet_root: Path = KUBELET_ROOT,
        cgroup_root: Path = CGROUP_ROOT,
        pods_cgroup: str = PODS_CGROUP,
        proc_root: Path = PROC_ROOT,
    ) -> None:
        self.kubelet_root = kubelet_root
        self.pods_dir = kubelet_root / "pods"
        self.cgroups = NodeCgroups(cgroup_root, pods_cgroup)
        self.processes = RankProcesses(proc_root)

    @property
    def available(self) -> bool:
        """This process sees the node's pods: the kubelet's pods directory and the pods
        cgroup are here."""
        return self.pods_dir.is_dir() and self.cgroups.available

    def read(self, pod: Obj, rank: int | None = None) -> NodeRankReading:
        """Rank ``rank`` of the pod (None: a one-rank pod's own): its counters, its pod's
        pressure, its shim sample. ValueError for a pod that is not a rank or group pod
        (`rank_pods`), or that does not hold ``rank``."""
        return self._readings([one_rank(pod, rank)])[0][1]

    def readings_of(self, pod: Obj) -> list[tuple[RankPod, NodeRankReading]]:
        """Every rank of the pod and its reading, in rank order (its cgroup read once);
        ValueError as `rank_pods`."""
        return self._readings(rank_pods(pod))

    def _readings(self, ranks: Sequence[RankPod]) -> list[tuple[RankPod, NodeRankReading]]:
        """Readings of ranks of one pod: a rank pod's counters are its cgroup's; a group
        pod's rank's are its process's CPU time and its pod's throttling (the quota, if
        any, is the pod's)."""
        first = ranks[0]
        pod_cpu, psi = self.cgroups.read(first.uid, first.qos)
        procs = self._processes(ranks) if first.group else {}
        out = []
        for who in ranks:
            cpu = pod_cpu
            if who.group:
                proc = procs.get(who.rank)
                cpu = None if proc is None else _process_counters(proc, pod_cpu)
            out.append((who, NodeRankReading(cpu, psi, self.shim_sample(who))))
        return out

    def shim_sample(self, who: RankPod) -> ShimSample | None:
        """The rank's latest record (None: none published, or not a readable record)."""
        try:
            fd = self._open_live(who.uid, self._record_name(who).name, os.O_RDONLY)
        except OSError:
            return None
        if fd is None:
            return None
        try:
            rec = snapshot_fd(fd, self._record_name(who), _RECORD_TRIES)
        except (OSError, UserError):
            return None
        finally:
            os.close(fd)
        if rec is None:
            return None
        return ShimSample(rec.compute_ns, rec.mpi_ns, rec.window_duty, rec.wait_mode)

    def set_wait_modes(self, pods: Sequence[Obj], mode: str) -> list[int]:
        """Ask every rank of ``pods`` (a group pod's: all of its ranks) to wait in ``mode``;
        returns their ranks. Every record is opened and checked before any is written, so
        when one is not published yet (`NotPublished`) none changes. UserError for an
        unknown mode or a file that is not a record; ValueError for a pod that is not a rank
        or group pod."""
        who = [w for p in pods for w in rank_pods(p)]
        fds: list[tuple[RankPod, int]] = []
        try:
            for w in who:
                try:
                    fd = self._open_live(w.uid, self._record_name(w).name, os.O_RDWR)
                except OSError as exc:
                    raise NotPublished(f"rank {w.rank} ({w.name}): no readable record: "
                                       f"{exc.strerror or exc}") from None  # fmt: skip
                if fd is None:
                    raise NotPublished(f"rank {w.rank} ({w.name}) has no live record yet")
                fds.append((w, fd))
            for w, fd in fds:
                if snapshot_fd(fd, self._record_name(w), _RECORD_TRIES) is None:
                    raise NotPublished(f"rank {w.rank} ({w.name})'s record is not published yet")
            for w, fd in fds:
                set_wait_mode_fd(fd, self._record_name(w), mode)
        finally:
            for _, fd in fds:
                os.close(fd)
        return [w.rank for w in who]

    def set_nices(self, pod: Obj, nices: Mapping[int, int]) -> list[int]:
        """Give each rank of ``nices`` (rank -> nice value 0..19) of the pod that nice value
        (every thread of its process); returns those ranks in order. UserError for a rank
        the pod does not hold or a value out of range; `NotPublished` when a rank's process
        is not known yet (no pid file, or no such process in the pod): then nothing is
        changed. OSError if the kernel refuses (lowering a nice needs CAP_SYS_NICE)."""
        ranks = {w.rank: w for w in rank_pods(pod)}
        for rank, nice in nices.items():
            if rank not in ranks:
                raise UserError(f"pod {pod['metadata'].get('name')} does not hold rank {rank}")
            if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= MAX_NICE:
                raise UserError(f"rank {rank}: a nice value is 0..{MAX_NICE}, not {nice!r}")
        wanted = [ranks[r] for r in sorted(nices)]
        procs = self._processes(wanted)
        for who in wanted:
            if who.rank not in procs:
                raise NotPublished(f"rank {who.rank} ({who.name}) has not started yet (no pid "
                                   "file, or no process of its pod with that pid)")  # fmt: skip
        for who in wanted:
            try:
                set_nice(procs[who.rank].host_pid, nices[who.rank])
            except ProcessLookupError:
                raise NotPublished(f"rank {who.rank} ({who.name})'s process ended") from None
        return [w.rank for w in wanted]

    def pod_pid(self, who: RankPod) -> int | None:
        """The rank's pid as its pod sees it (its `PID_FILE`); None: no such file yet, or
        not a regular file of at most `MAX_PID_FILE` bytes holding a pid."""
        try:
            fd = self._open_live(who.uid, pid_file_name(who.rank), os.O_RDONLY)
        except OSError:
            return None
        if fd is None:
            return None
        try:
            if os.fstat(fd).st_size > MAX_PID_FILE:
                return None
            data = os.pread(fd, MAX_PID_FILE + 1, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(data) > MAX_PID_FILE or not _PID.fullmatch(data):
            return None
        return int(data) or None

    def _processes(self, ranks: Sequence[RankPod]) -> dict[int, RankProcess]:
        """The host processes of ranks of one pod that are known (rank -> process)."""
        pod_pids = {w.rank: pid for w in ranks if (pid := self.pod_pid(w)) is not None}
        pod_dir = self.cgroups.pod_dir(ranks[0].uid, ranks[0].qos) if pod_pids else None
        if pod_dir is None:
            return {}
        return self.processes.resolve(ranks[0].uid, pod_pids, pod_dir)

    def _record_name(self, who: RankPod) -> Path:
        return self.record_dir(who.uid) / f"rank-{who.rank}.rec"

    def record_dir(self, uid: str) -> Path:
        """Where the node sees the pod's ``rankpack-live`` volume."""
        return self.pods_dir / uid / "volumes" / "kubernetes.io~empty-dir" / LIVE_VOLUME

    def _open_live(self, uid: str, name: str, flags: int) -> int | None:
        """File ``name`` of the pod's ``rankpack-live`` volume, opened without following a
        link below the kubelet's pods directory and without blocking; None if it (or its
        directory) does not exist; OSError if a component is a link or the file is not a
        regular file."""
        try:
            d = os.open(self.pods_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            for part in (uid, "volumes", "kubernetes.io~empty-dir", LIVE_VOLUME):
                nxt = os.open(part, _DIR_FLAGS, dir_fd=d)
                os.close(d)
                d = nxt
            fd = os.open(name,
                         flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                         dir_fd=d)  # fmt: skip
        except FileNotFoundError:
            return None
        finally:
            os.close(d)
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except OSError:
            regular = False
        if not regular:
            os.close(fd)
            raise OSError(f"{name} is not a regular file")
        return fd


def _process_counters(proc: RankProcess, pod: CpuCounters | None) -> CpuCounters:
    """A group pod's rank's counters: its process's CPU time, its pod's throttling."""
    usage_ns = proc.stat.cpu_ticks * 1_000_000_000 // _CLOCK_TICKS
    return CpuCounters(usage_ns, pod.nr_throttled if pod else 0, pod.throttled_ns if pod else 0)
