"""FakeNodeFilesystems: fakes of a node's two filesystems the node reader reads, under a test
directory: the kubelet's root (``pods/<uid>/volumes/kubernetes.io~empty-dir/rankpack-live/``
holding the shim's records, written in `rankpack.profile.records`' layout) and a cgroupfs
tree (v1: ``cpu``/``cpuacct`` hierarchies; v2: one hierarchy with ``cpu.pressure``).
`rank_pod_object` is a rank pod as the API lists it, `group_pod_object` a group pod (decision
0012); `FakeProc` a fake ``/proc`` of the processes a group pod's ranks are found among.
"""

from __future__ import annotations

import struct
import uuid
from pathlib import Path
from typing import Any

from rankpack.profile import records

Obj = dict[str, Any]
_LAYOUT = struct.Struct("<" + "".join(fmt for _, fmt in records.RECORD_FIELDS))
QOS_DIR = {"Guaranteed": "", "Burstable": "burstable", "BestEffort": "besteffort"}


def record_bytes(
    rank: int,
    *,
    seq: int = 2,
    compute_ns: int = 0,
    mpi_ns: int = 0,
    window: tuple[int, int] | None = None,
    wait_mode: str = "spin",
    wait_ctl: str = "spin",
    magic: int = records.RECORD_MAGIC,
) -> bytes:
    """A rank's live record as the shim publishes it (``window``: the latest window's
    compute and MPI ns; None: no window completed yet)."""
    values: dict[str, Any] = {}
    for name, fmt in records.RECORD_FIELDS:
        values[name] = b"" if fmt.endswith("s") else 0
    values.update(
        seq=seq, magic=magic, version=records.RECORD_VERSION, record_size=records.RECORD_SIZE,
        rank=rank, world_size=4, pid=100 + rank, host=b"rank-pod",
        wait_ctl=records.WAIT_MODE_NAMES.index(wait_ctl),
        wait_mode=records.WAIT_MODE_NAMES.index(wait_mode), compute_ns=compute_ns,
        mpi_ns=mpi_ns, updates=1,
    )  # fmt: skip
    if window is not None:
        values.update(window_end_ns=1, window_compute_ns=window[0], window_mpi_ns=window[1])
    flat = [values[name] for name, _ in records.RECORD_FIELDS[:-1]]
    return _LAYOUT.pack(*flat, *([0] * (2 * records.MAX_FUNCS)))


class FakeNodeFilesystems:
    """A fake kubelet root and a fake cgroupfs of one node, under ``root``."""

    def __init__(self, root: Path, *, v2: bool = True, pods_cgroup: str = "kubepods") -> None:
        self.kubelet_root = root / "kubelet"
        self.cgroup_root = root / "cgroup"
        self.pods_cgroup = pods_cgroup
        self.v2 = v2
        (self.kubelet_root / "pods").mkdir(parents=True)
        if v2:
            (self.cgroup_root / pods_cgroup).mkdir(parents=True)
            (self.cgroup_root / "cgroup.controllers").write_text("cpu memory\n")
        else:
            for h in ("cpu", "cpuacct"):
                (self.cgroup_root / h / pods_cgroup).mkdir(parents=True)

    def live_dir(self, uid: str) -> Path:
        return self.kubelet_root / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / (
            "rankpack-live")  # fmt: skip

    def add_cgroup(
        self,
        uid: str,
        qos: str = "Burstable",
        *,
        usage_ns: int = 0,
        nr_throttled: int = 0,
        throttled_ns: int = 0,
        pressure: str | None = None,
    ) -> None:
        """The pod's cgroup with its counters (``pressure``: cpu.pressure's text, v2)."""
        rel = Path(self.pods_cgroup) / QOS_DIR[qos] / f"pod{uid}"
        if self.v2:
            d = self.cgroup_root / rel
            d.mkdir(parents=True)
            (d / "cpu.stat").write_text(
                f"usage_usec {usage_ns // 1000}\nuser_usec 1\nsystem_usec 1\nnr_periods 9\n"
                f"nr_throttled {nr_throttled}\nthrottled_usec {throttled_ns // 1000}\n"
            )
            if pressure is not None:
                (d / "cpu.pressure").write_text(pressure)
            return
        acct, cpu = self.cgroup_root / "cpuacct" / rel, self.cgroup_root / "cpu" / rel
        acct.mkdir(parents=True)
        cpu.mkdir(parents=True)
        (acct / "cpuacct.usage").write_text(f"{usage_ns}\n")
        (cpu / "cpu.stat").write_text(
            f"nr_periods 9\nnr_throttled {nr_throttled}\nthrottled_time {throttled_ns}\n"
        )

    def pod_cgroup(self, uid: str, qos: str = "Burstable") -> Path:
        """The pod-level cgroup directory (v1: the ``cpuacct`` hierarchy's)."""
        base = self.cgroup_root if self.v2 else self.cgroup_root / "cpuacct"
        return base / self.pods_cgroup / QOS_DIR[qos] / f"pod{uid}"

    def add_procs(
        self, uid: str, pids: list[int], container: str = "rank", qos: str = "Burstable"
    ) -> None:
        """The pod's container ``container``'s processes (its ``cgroup.procs``)."""
        d = self.pod_cgroup(uid, qos) / container
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))

    def write_pid(self, uid: str, rank: int, text: str) -> Path:
        """Rank ``rank``'s pid file, as its launcher writes it."""
        d = self.live_dir(uid)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"rank-{rank}.pid"
        path.write_text(text)
        return path

    def write_record(self, uid: str, rank: int, data: bytes | None = None, **kw: Any) -> Path:
        """Rank ``rank``'s record in the pod's ``rankpack-live`` volume."""
        d = self.live_dir(uid)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"rank-{rank}.rec"
        path.write_bytes(data if data is not None else record_bytes(rank, **kw))
        return path


def new_uid() -> str:
    return str(uuid.uuid4())


def _pod_object(
    name: str, uid: str, sim: str, own: dict[str, str], annotations: dict[str, str],
    namespace: str, node: str, qos: str, phase: str,
) -> Obj:  # fmt: skip
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "labels": {"app.kubernetes.io/managed-by": "rankpack", "rankpack.dev/sim": sim, **own},
    }
    if annotations:
        meta["annotations"] = annotations
    return {
        "metadata": meta,
        "spec": {"nodeName": node},
        "status": {"phase": phase, "qosClass": qos},
    }


def rank_pod_object(
    uid: str,
    sim: str = "s1",
    rank: int = 0,
    *,
    namespace: str = "runs",
    node: str = "node-1",
    qos: str = "Burstable",
    phase: str = "Running",
) -> Obj:
    return _pod_object(f"rankpack-{sim}-{rank}", uid, sim, {"rankpack.dev/rank": str(rank)}, {},
                       namespace, node, qos, phase)  # fmt: skip


def group_pod_object(
    uid: str,
    sim: str = "s1",
    ranks: str = "0-3",
    *,
    group: int = 0,
    namespace: str = "runs",
    node: str = "node-1",
    qos: str = "Burstable",
    phase: str = "Running",
) -> Obj:
    """A group pod (decision 0012) holding ``ranks`` (its annotation's text)."""
    return _pod_object(f"rankpack-{sim}-g{group}", uid, sim, {"rankpack.dev/group": str(group)},
                       {"rankpack.dev/ranks": ranks}, namespace, node, qos, phase)  # fmt: skip


class FakeProc:
    """A fake ``/proc`` under ``root``: per process its ``status`` (``NSpid``) and ``stat``
    (CPU ticks, start time)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(
        self,
        host_pid: int,
        ns_pids: tuple[int, ...],
        *,
        starttime: int = 1000,
        utime: int = 0,
        stime: int = 0,
        comm: str = "simple Foam) x",
    ) -> None:
        """Process ``host_pid`` whose ``NSpid`` line is ``host_pid`` then ``ns_pids``."""
        d = self.root / str(host_pid)
        d.mkdir(exist_ok=True)
        nspid = "\t".join(str(p) for p in (host_pid, *ns_pids))
        (d / "status").write_text(f"Name:\tx\nTgid:\t{host_pid}\nNSpid:\t{nspid}\n")
        # fields 3.. of stat(5): state, ppid, ..., utime (14), stime (15), ..., starttime (22)
        rest = ["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", str(utime), str(stime),
                "0", "0", "20", "0", "1", "0", str(starttime), "0", "0"]  # fmt: skip
        (d / "stat").write_text(f"{host_pid} ({comm}) " + " ".join(rest) + "\n")

    def remove(self, host_pid: int) -> None:
        d = self.root / str(host_pid)
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
