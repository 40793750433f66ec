"""Per-rank CPU counters of rank pods, read from the node's cgroups.

Chosen source (decision 0008): the pod's own cgroup on the node, read directly — exact
cumulative nanoseconds, no extra permission and no sampling delay. This needs the
controller to run on the node, which is true of the dev cluster (one node, controller on
the host). On a real multi-node cluster the kubelet's ``/stats/summary`` (needs
``nodes/proxy``) or the metrics API (metrics-server, ~15 s resolution) would be the
sources; `NodeCgroupUsage.available` is False there and the backend reports zero usage.

Layouts (cgroupfs driver, as the kubelet names them):

- v1: ``/sys/fs/cgroup/cpuacct/kubepods/<qos>/pod<UID>/cpuacct.usage`` and
  ``/sys/fs/cgroup/cpu/kubepods/<qos>/pod<UID>/cpu.stat`` (``cpu,cpuacct`` when co-mounted);
- v2: ``/sys/fs/cgroup/kubepods/<qos>/pod<UID>/cpu.stat`` (``usage_usec``, throttling);

where ``<qos>`` is ``burstable`` or ``besteffort``, and Guaranteed pods sit right below
``kubepods``. A kubelet with a ``cgroupRoot`` of its own (the dev cluster's nodes, several
on one machine) has ``<root>/kubepods`` instead: ``kubepods`` one level down is read too.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rankpack.backend.kubernetes.api import ApiError

Obj = dict[str, Any]

QOS_DIRS = ("burstable", "", "besteffort")


@dataclass(frozen=True)
class CpuCounters:
    usage_ns: int
    nr_throttled: int = 0
    throttled_ns: int = 0


class UsageSource(Protocol):
    name: str

    def read(self, pod: Obj) -> CpuCounters | None:
        """The rank pod's cumulative CPU counters (None if they cannot be read)."""
        ...


class Exec(Protocol):
    def exec(self, pod: str, container: str, argv: Sequence[str], timeout_s: float) -> Any: ...


READ_OWN_CGROUP = (
    "/bin/sh",
    "-c",
    "cat /sys/fs/cgroup/cpu.stat 2>/dev/null && exit 0; "
    "echo usage_ns $(cat /sys/fs/cgroup/cpuacct/cpuacct.usage); "
    "cat /sys/fs/cgroup/cpu/cpu.stat",
)
"""Inside a container its cgroup is mounted at /sys/fs/cgroup (v2: one file; v1: cpuacct
and cpu hierarchies)."""


class PodExecUsage:
    """The container's own cgroup read through ``pods/exec`` (any cluster, only the Role's
    ``pods/exec``): slower (one exec per rank), so a reading is reused for ``interval_s``."""

    name = "pod-exec"

    def __init__(self, api: Exec, container: str, interval_s: float = 2.0) -> None:
        self.api = api
        self.container = container
        self.interval_s = interval_s
        self._cache: dict[str, tuple[float, CpuCounters]] = {}

    def read(self, pod: Obj) -> CpuCounters | None:
        name = str(pod.get("metadata", {}).get("name", ""))
        now = time.monotonic()
        cached = self._cache.get(name)
        if cached is not None and now - cached[0] < self.interval_s:
            return cached[1]
        try:
            out = self.api.exec(name, self.container, READ_OWN_CGROUP, 10.0)
        except ApiError:  # a pod that is going away: keep the last reading
            return cached[1] if cached else None
        counters = parse_cpu_stat(str(getattr(out, "stdout", "")))
        if counters is None:
            return cached[1] if cached else None
        self._cache[name] = (now, counters)
        return counters


def parse_cpu_stat(text: str) -> CpuCounters | None:
    """v2 ``cpu.stat`` (usage_usec, throttled_usec) or v1 (usage_ns line + cpu.stat)."""
    stat: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if value.strip().isdigit():
            stat[key] = int(value)
    if "usage_usec" in stat:
        return CpuCounters(
            stat["usage_usec"] * 1000,
            stat.get("nr_throttled", 0),
            stat.get("throttled_usec", 0) * 1000,
        )
    if "usage_ns" in stat:
        return CpuCounters(
            stat["usage_ns"], stat.get("nr_throttled", 0), stat.get("throttled_time", 0)
        )
    return None


def _pods_cgroups(base: Path) -> list[Path]:
    """``kubepods`` below a hierarchy's root, and ``<node root>/kubepods`` (kubelets with a
    ``cgroupRoot`` of their own: a pod's UID names its cgroup in one of them only)."""
    found = [base / "kubepods"] if (base / "kubepods").is_dir() else []
    with contextlib.suppress(OSError):
        found += sorted(d / "kubepods" for d in base.iterdir() if (d / "kubepods").is_dir())
    return found


class NodeCgroupUsage:
    """The pod-level cgroup of a rank pod on this node (includes every container of it)."""

    name = "node-cgroup"

    def __init__(self, root: Path = Path("/sys/fs/cgroup")) -> None:
        self.root = root
        self.v2 = (root / "cgroup.controllers").is_file()
        self.cpuacct = next(
            (root / d for d in ("cpuacct", "cpu,cpuacct") if _pods_cgroups(root / d)), None
        )
        self.cpu = next((root / d for d in ("cpu", "cpu,cpuacct") if _pods_cgroups(root / d)), None)

    @property
    def available(self) -> bool:
        if self.v2:
            return bool(_pods_cgroups(self.root))
        return self.cpuacct is not None

    def _pod_dir(self, base: Path, pod_uid: str) -> Path | None:
        for pods in _pods_cgroups(base):
            for qos in QOS_DIRS:
                d = pods / qos / f"pod{pod_uid}" if qos else pods / f"pod{pod_uid}"
                if d.is_dir():
                    return d
        return None

    def read(self, pod: Obj) -> CpuCounters | None:
        pod_uid = str(pod.get("metadata", {}).get("uid", ""))
        if not pod_uid:
            return None
        try:
            if self.v2:
                d = self._pod_dir(self.root, pod_uid)
                if d is None:
                    return None
                stat = _keyed(d / "cpu.stat")
                return CpuCounters(
                    stat.get("usage_usec", 0) * 1000,
                    stat.get("nr_throttled", 0),
                    stat.get("throttled_usec", 0) * 1000,
                )
            if self.cpuacct is None:
                return None
            d = self._pod_dir(self.cpuacct, pod_uid)
            if d is None:
                return None
            usage = int((d / "cpuacct.usage").read_text())
            nthr = thr = 0
            cpu_dir = self._pod_dir(self.cpu, pod_uid) if self.cpu else None
            if cpu_dir is not None:
                stat = _keyed(cpu_dir / "cpu.stat")
                nthr, thr = stat.get("nr_throttled", 0), stat.get("throttled_time", 0)
            return CpuCounters(usage, nthr, thr)
        except (OSError, ValueError):
            return None


def _keyed(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def detect(api: Exec, container: str) -> UsageSource:
    """The node's cgroups when this process runs on the rank pods' node (the dev cluster),
    else the containers' own cgroups read through ``pods/exec``."""
    source = NodeCgroupUsage()
    return source if source.available else PodExecUsage(api, container)
