"""Linux cgroups for rank pods, v1 and v2, with the kubelet's CPU mapping.

Used by the local backend (its drivers, `CgroupV1`/`CgroupV2`); the Kubernetes node reader
(`rankpack.backend.kubernetes.nodes.nodereader`) parses its pods' counters with the same
`cpu_stat_v1`/`cpu_stat_v2`, the one parser of ``cpu.stat``. The mapping functions are the
kubelet's
(pkg/kubelet/cm/helpers_linux.go), so a plan means the same locally as on Kubernetes:

* shares = clamp(milliCPU * 1024 // 1000, 2, 262144)   (0 millicores -> 2)
* v2 weight = 1 + (shares - 2) * 9999 // 262142         (the kubelet's pod-level formula)
* quota_us = max(milliCPU * period_us // 1000, 1000), period 100000 us; no limit -> no quota

rankpack creates and owns one subtree per run (``rankpack/<run>/rank-<i>``) and never
touches cgroups it did not create.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from rankpack._proc import alive
from rankpack.errors import UserError

MIN_SHARES = 2
MAX_SHARES = 262144
SHARES_PER_CPU = 1024
MILLI_PER_CPU = 1000
DEFAULT_PERIOD_US = 100_000
MIN_QUOTA_US = 1000
SUBTREE = "rankpack"


def millis_to_shares(milli_cpu: int) -> int:
    if milli_cpu <= 0:
        return MIN_SHARES
    shares = milli_cpu * SHARES_PER_CPU // MILLI_PER_CPU
    return max(MIN_SHARES, min(MAX_SHARES, shares))


def shares_to_weight(shares: int) -> int:
    return 1 + (shares - 2) * 9999 // 262142


def millis_to_weight(milli_cpu: int) -> int:
    return shares_to_weight(millis_to_shares(milli_cpu))


def millis_to_quota_us(milli_cpu: int | None, period_us: int = DEFAULT_PERIOD_US) -> int | None:
    """CFS quota for a limit; None (unlimited) when there is no limit."""
    if milli_cpu is None or milli_cpu <= 0:
        return None
    return max(milli_cpu * period_us // MILLI_PER_CPU, MIN_QUOTA_US)


@dataclass(frozen=True)
class CpuStat:
    """What one rank cgroup has used so far."""

    usage_ns: int
    nr_periods: int
    nr_throttled: int
    throttled_ns: int


@dataclass(frozen=True)
class CpuSettings:
    """The values written to the cgroup files, for display and checks."""

    shares: int | None
    weight: int | None
    quota_us: int | None
    period_us: int


def request_millis_of(settings: CpuSettings) -> int:
    """The CPU request (millicores) that the cgroup's weight stands for (inverse of the
    kubelet's mapping, exact to the rounding of shares)."""
    shares = settings.shares
    if shares is None and settings.weight is not None:
        shares = 2 + (settings.weight - 1) * 262142 // 9999
    return round((shares or 2) * 1000 / 1024)


def limit_millis_of(settings: CpuSettings) -> int | None:
    if settings.quota_us is None:
        return None
    return round(settings.quota_us * 1000 / settings.period_us)


class CgroupDriver(Protocol):
    version: Literal["v1", "v2"]

    def create(self, rel: str) -> None: ...
    def remove(self, rel: str) -> None: ...
    def exists(self, rel: str) -> bool: ...
    def set_cpu(self, rel: str, request_millis: int, limit_millis: int | None) -> CpuSettings: ...
    def read_settings(self, rel: str) -> CpuSettings: ...
    def read_stat(self, rel: str) -> CpuStat: ...
    def pids(self, rel: str) -> list[int]: ...
    def join_dirs(self, rel: str) -> list[Path]:
        """Directories whose ``cgroup.procs`` a process writes to join this cgroup."""
        ...

    def children(self, rel: str) -> list[str]: ...


def _read(path: Path) -> str:
    return path.read_text().strip()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def parse_kv(text: str) -> dict[str, int]:
    """A flat-keyed cgroup file (``cpu.stat``: ``key value`` lines) as numbers; the one
    parser of cgroup counters (the local backend's drivers, the Kubernetes node reader)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def cpu_stat_v2(stat_text: str) -> CpuStat:
    """A cgroup v2 ``cpu.stat`` (microseconds) as a `CpuStat` (nanoseconds)."""
    stat = parse_kv(stat_text)
    return CpuStat(
        usage_ns=stat.get("usage_usec", 0) * 1000,
        nr_periods=stat.get("nr_periods", 0),
        nr_throttled=stat.get("nr_throttled", 0),
        throttled_ns=stat.get("throttled_usec", 0) * 1000,
    )


def cpu_stat_v1(stat_text: str, usage_text: str) -> CpuStat:
    """A cgroup v1 ``cpu.stat`` (``""``: no cpu hierarchy) and ``cpuacct.usage`` (both in
    nanoseconds) as a `CpuStat`."""
    stat = parse_kv(stat_text)
    return CpuStat(
        usage_ns=int(usage_text.strip()),
        nr_periods=stat.get("nr_periods", 0),
        nr_throttled=stat.get("nr_throttled", 0),
        throttled_ns=stat.get("throttled_time", 0),
    )


def _pids_in(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except FileNotFoundError:
        return []


def _children(base: Path) -> list[str]:
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.is_dir())


def _rmdir(path: Path) -> None:
    # A cgroup whose last process just exited can briefly refuse removal (EBUSY).
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            time.sleep(0.02)
    path.rmdir()


class CgroupV1:
    """cgroup v1: ``cpu`` (shares, quota, stat) and ``cpuacct`` (usage) hierarchies."""

    version: Literal["v1", "v2"] = "v1"

    def __init__(self, cpu_root: Path, cpuacct_root: Path) -> None:
        self.cpu_root = cpu_root
        self.cpuacct_root = cpuacct_root

    def _dirs(self, rel: str) -> list[Path]:
        dirs = [self.cpu_root / rel]
        if self.cpuacct_root != self.cpu_root:
            dirs.append(self.cpuacct_root / rel)
        return dirs

    def create(self, rel: str) -> None:
        for d in self._dirs(rel):
            d.mkdir(parents=True, exist_ok=True)

    def remove(self, rel: str) -> None:
        for d in self._dirs(rel):
            _rmdir(d)

    def exists(self, rel: str) -> bool:
        return (self.cpu_root / rel).is_dir()

    def set_cpu(self, rel: str, request_millis: int, limit_millis: int | None) -> CpuSettings:
        d = self.cpu_root / rel
        shares = millis_to_shares(request_millis)
        period = DEFAULT_PERIOD_US
        quota = millis_to_quota_us(limit_millis, period)
        _write(d / "cpu.cfs_period_us", str(period))
        _write(d / "cpu.cfs_quota_us", str(quota if quota is not None else -1))
        _write(d / "cpu.shares", str(shares))
        return CpuSettings(shares=shares, weight=None, quota_us=quota, period_us=period)

    def read_settings(self, rel: str) -> CpuSettings:
        d = self.cpu_root / rel
        quota = int(_read(d / "cpu.cfs_quota_us"))
        return CpuSettings(
            shares=int(_read(d / "cpu.shares")),
            weight=None,
            quota_us=None if quota < 0 else quota,
            period_us=int(_read(d / "cpu.cfs_period_us")),
        )

    def read_stat(self, rel: str) -> CpuStat:
        return cpu_stat_v1(
            _read(self.cpu_root / rel / "cpu.stat"),
            _read(self.cpuacct_root / rel / "cpuacct.usage"),
        )

    def pids(self, rel: str) -> list[int]:
        seen: list[int] = []
        for d in self._dirs(rel):
            for pid in _pids_in(d / "cgroup.procs"):
                if pid not in seen:
                    seen.append(pid)
        return seen

    def join_dirs(self, rel: str) -> list[Path]:
        return self._dirs(rel)

    def children(self, rel: str) -> list[str]:
        return _children(self.cpu_root / rel)


class CgroupV2:
    """cgroup v2 (unified): ``cpu.weight``, ``cpu.max``, ``cpu.stat``."""

    version: Literal["v1", "v2"] = "v2"

    def __init__(self, root: Path) -> None:
        self.root = root

    def create(self, rel: str) -> None:
        # Every ancestor below the root must delegate the cpu controller to its children.
        current = self.root
        for part in Path(rel).parts:
            _enable_cpu_controller(current)
            current = current / part
            current.mkdir(exist_ok=True)

    def remove(self, rel: str) -> None:
        _rmdir(self.root / rel)

    def exists(self, rel: str) -> bool:
        return (self.root / rel).is_dir()

    def set_cpu(self, rel: str, request_millis: int, limit_millis: int | None) -> CpuSettings:
        d = self.root / rel
        weight = millis_to_weight(request_millis)
        period = DEFAULT_PERIOD_US
        quota = millis_to_quota_us(limit_millis, period)
        _write(d / "cpu.max", f"{quota if quota is not None else 'max'} {period}")
        _write(d / "cpu.weight", str(weight))
        return CpuSettings(shares=None, weight=weight, quota_us=quota, period_us=period)

    def read_settings(self, rel: str) -> CpuSettings:
        d = self.root / rel
        quota_text, period_text = _read(d / "cpu.max").split()
        return CpuSettings(
            shares=None,
            weight=int(_read(d / "cpu.weight")),
            quota_us=None if quota_text == "max" else int(quota_text),
            period_us=int(period_text),
        )

    def read_stat(self, rel: str) -> CpuStat:
        return cpu_stat_v2(_read(self.root / rel / "cpu.stat"))

    def pids(self, rel: str) -> list[int]:
        return _pids_in(self.root / rel / "cgroup.procs")

    def join_dirs(self, rel: str) -> list[Path]:
        return [self.root / rel]

    def children(self, rel: str) -> list[str]:
        return _children(self.root / rel)


def _enable_cpu_controller(cgroup: Path) -> None:
    control = cgroup / "cgroup.subtree_control"
    try:
        enabled = _read(control).split()
    except FileNotFoundError:
        return
    if "cpu" not in enabled:
        _write(control, "+cpu")


def detect(fs_root: Path = Path("/sys/fs/cgroup")) -> CgroupDriver:
    """The cgroup driver for this machine; a UserError if neither layout has a cpu controller."""
    controllers = fs_root / "cgroup.controllers"
    if controllers.exists() and "cpu" in _read(controllers).split():
        return CgroupV2(fs_root)
    cpu = fs_root / "cpu"
    if (cpu / "cpu.shares").exists():
        cpuacct = fs_root / "cpuacct"
        if not (cpuacct / "cpuacct.usage").exists():
            cpuacct = cpu  # combined cpu,cpuacct mount
        return CgroupV1(cpu, cpuacct)
    for combined in ("cpu,cpuacct", "cpuacct,cpu"):
        d = fs_root / combined
        if (d / "cpu.shares").exists():
            return CgroupV1(d, d)
    raise UserError(
        f"no cgroup cpu controller found under {fs_root}; run on a host with cgroup v1 or v2 "
        "cpu control, or pass --no-cgroups to run uncontained"
    )


def check_writable(driver: CgroupDriver) -> None:
    """Fail early, with the fix, when this user may not create cgroups."""
    probe = f"{SUBTREE}/.probe-{os.getpid()}"
    try:
        driver.create(probe)
        driver.remove(probe)
    except PermissionError:
        raise UserError(
            "no permission to create cgroups (rankpack needs root or a delegated cgroup "
            "subtree); run as root, or pass --no-cgroups to run uncontained"
        ) from None
    except OSError as exc:
        raise UserError(
            f"cannot create cgroups ({exc.strerror}); pass --no-cgroups to run uncontained"
        ) from None


def kill_all(driver: CgroupDriver, rel: str, grace_s: float = 2.0) -> None:
    """SIGTERM every process in a cgroup, then SIGKILL what is left after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        pids = driver.pids(rel)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and driver.pids(rel):
            time.sleep(0.05)


def remove_tree(driver: CgroupDriver, rel: str) -> None:
    """Kill whatever is left in ``rel`` and its children, then remove them, deepest first."""
    if not driver.exists(rel):
        return
    for child in driver.children(rel):
        remove_tree(driver, f"{rel}/{child}")
    kill_all(driver, rel)
    driver.remove(rel)


def reap_stale_runs(driver: CgroupDriver) -> list[str]:
    """Remove run subtrees left by a rankpack process that no longer exists.

    Run cgroups are named ``run-<id>-<owner pid>``; a controller killed with SIGKILL cannot
    clean up, so the next rankpack process does it.
    """
    reaped: list[str] = []
    for name in driver.children(SUBTREE):
        parts = name.split("-")
        if len(parts) < 3 or parts[0] != "run" or not parts[-1].isdigit():
            continue
        owner = int(parts[-1])
        if owner == os.getpid() or alive(owner):
            continue
        remove_tree(driver, f"{SUBTREE}/{name}")
        reaped.append(name)
    return reaped
