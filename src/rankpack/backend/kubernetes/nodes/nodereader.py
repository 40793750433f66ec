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
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankpack.backend.cgroups import cpu_stat_v1, cpu_stat_v2
from rankpack.backend.kubernetes.objects.builders import LIVE_VOLUME, RANK_LABEL, SIM_LABEL
from rankpack.backend.mpirun import ShimSample
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
    """What the node says of one rank pod now."""

    cpu: CpuCounters | None
    """None: its cgroup is not there (not started yet, or gone)."""
    psi: Pressure | None = None
    """None: cgroup v1, or a kernel without PSI."""
    shim: ShimSample | None = None
    """None: no published record (no shim, or before MPI_Init)."""


@dataclass(frozen=True)
class RankPod:
    """A rank pod's identity, checked (what paths are built from)."""

    namespace: str
    name: str
    uid: str
    sim: str
    rank: int
    qos: str
    node: str


def rank_pod(pod: Obj) -> RankPod:
    """The identity of a rank pod object; ValueError if its uid is not a UUID or its rank
    label not a number (nothing is read for such a pod)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    uid = str(meta.get("uid") or "")
    rank = str(labels.get(RANK_LABEL) or "")
    if not _UID.match(uid):
        raise ValueError(f"pod uid {uid[:64]!r} is not a UUID")
    if not _RANK.match(rank):
        raise ValueError(f"rank label {rank[:64]!r} is not a number")
    return RankPod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=uid,
        sim=str(labels.get(SIM_LABEL) or ""),
        rank=int(rank),
        qos=str((pod.get("status") or {}).get("qosClass") or ""),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
    )


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

    def read(self, uid: str, qos: str = "") -> tuple[CpuCounters | None, Pressure | None]:
        """The pod's counters and pressure (``uid`` checked by the caller: `rank_pod`)."""
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
    """Readings of this node's rank pods; the wait-mode control word of their ranks."""

    def __init__(
        self,
        kubelet_root: Path = KUBELET_ROOT,
        cgroup_root: Path = CGROUP_ROOT,
        pods_cgroup: str = PODS_CGROUP,
    ) -> None:
        self.kubelet_root = kubelet_root
        self.pods_dir = kubelet_root / "pods"
        self.cgroups = NodeCgroups(cgroup_root, pods_cgroup)

    @property
    def available(self) -> bool:
        """This process sees the node's pods: the kubelet's pods directory and the pods
        cgroup are here."""
        return self.pods_dir.is_dir() and self.cgroups.available

    def read(self, pod: Obj) -> NodeRankReading:
        """The rank pod's counters, pressure and shim sample; ValueError for a pod whose uid
        or rank label is not what a rank pod has."""
        who = rank_pod(pod)
        cpu, psi = self.cgroups.read(who.uid, who.qos)
        return NodeRankReading(cpu, psi, self.shim_sample(who))

    def shim_sample(self, who: RankPod) -> ShimSample | None:
        """The rank's latest record (None: none published, or not a readable record)."""
        try:
            fd = self._open_record(who, os.O_RDONLY)
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
        """Ask every rank of ``pods`` to wait in ``mode``; returns their ranks. Every record
        is opened and checked before any is written, so when one is not published yet
        (`NotPublished`) none changes. UserError for an unknown mode or a file that is not
        a record; ValueError for a pod that is not a rank pod."""
        who = [rank_pod(p) for p in pods]
        fds: list[tuple[RankPod, int]] = []
        try:
            for w in who:
                try:
                    fd = self._open_record(w, os.O_RDWR)
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

    def _record_name(self, who: RankPod) -> Path:
        return self.record_dir(who.uid) / f"rank-{who.rank}.rec"

    def record_dir(self, uid: str) -> Path:
        """Where the node sees the pod's ``rankpack-live`` volume."""
        return self.pods_dir / uid / "volumes" / "kubernetes.io~empty-dir" / LIVE_VOLUME

    def _open_record(self, who: RankPod, flags: int) -> int | None:
        """The rank's record, opened without following a link below the kubelet's pods
        directory; None if it (or its directory) does not exist; OSError if a component is a
        link or the record is not a regular file."""
        try:
            d = os.open(self.pods_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            for part in (who.uid, "volumes", "kubernetes.io~empty-dir", LIVE_VOLUME):
                nxt = os.open(part, _DIR_FLAGS, dir_fd=d)
                os.close(d)
                d = nxt
            fd = os.open(f"rank-{who.rank}.rec",
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
            raise OSError(f"rank-{who.rank}.rec is not a regular file")
        return fd


# -- the wire form (``GET /v1/ranks``): the agent writes it, the backend's client reads it ---


def reading_json(who: RankPod, reading: NodeRankReading) -> Obj:
    """One rank pod's entry in ``/v1/ranks`` (counters null when its cgroup is not there)."""
    cpu, psi, shim = reading.cpu, reading.psi, reading.shim
    return {
        "namespace": who.namespace,
        "pod": who.name,
        "uid": who.uid,
        "sim": who.sim,
        "rank": who.rank,
        "usage_ns": cpu.usage_ns if cpu else None,
        "nr_throttled": cpu.nr_throttled if cpu else None,
        "throttled_ns": cpu.throttled_ns if cpu else None,
        "psi": None if psi is None else {
            "some_avg10": psi.some_avg10, "some_total_us": psi.some_total_us,
            "full_avg10": psi.full_avg10, "full_total_us": psi.full_total_us,
        },
        "shim": None if shim is None else {
            "compute_ns": shim.compute_ns, "mpi_ns": shim.mpi_ns,
            "duty_window": shim.duty_window, "wait_mode": shim.wait_mode,
        },
    }  # fmt: skip


def reading_from_json(entry: Obj) -> NodeRankReading:
    """The reading of one ``/v1/ranks`` entry; ValueError if it does not have the shape
    `reading_json` gives (the answer is checked, not trusted)."""
    if not isinstance(entry, dict):
        raise ValueError("a rank entry is not an object")
    cpu = None
    if entry.get("usage_ns") is not None:
        cpu = CpuCounters(_int(entry["usage_ns"]), _int(entry.get("nr_throttled") or 0),
                          _int(entry.get("throttled_ns") or 0))  # fmt: skip
    psi = None
    p = entry.get("psi")
    if isinstance(p, dict):
        psi = Pressure(
            _float(p.get("some_avg10")),
            _int(p.get("some_total_us")),
            _opt(_float, p.get("full_avg10")),
            _opt(_int, p.get("full_total_us")),
        )
    shim = None
    sh = entry.get("shim")
    if isinstance(sh, dict):
        mode = sh.get("wait_mode")
        shim = ShimSample(_opt(_int, sh.get("compute_ns")), _opt(_int, sh.get("mpi_ns")),
                          _opt(_float, sh.get("duty_window")),
                          str(mode) if mode is not None else None)  # fmt: skip
    return NodeRankReading(cpu, psi, shim)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a counter")
    return value


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def _opt(kind: Any, value: Any) -> Any:
    return None if value is None else kind(value)
