"""The rank cgroups of a local run: the machine's "rank pods".

A run launched by rankpack process P is the cgroup ``rankpack/run-<sim>-<P>``; each rank is
``rank-<i>`` below it. Like the kubelet, the ``rankpack`` parent weighs the machine's CPUs
(kubepods = allocatable) and a run weighs the sum of its ranks' requests, so rank pods
compete with the rest of the host as they would on a node. Resizing a rank is a write to
its cgroup files, complete when the write returns.

`RunCgroups` is one run's tree (create, resize, read, kill, remove); `runs` lists every run
on the machine, also those of other rankpack processes (for the inventory, `list` and
`adopt`). The cgroup files themselves are `rankpack.backend.cgroups`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rankpack.backend import cgroups
from rankpack.backend.protocol import LaunchFailed, RankResources

_RUN_CGROUP = re.compile(r"^run-(?P<sim>.+)-(?P<pid>\d+)$")


@dataclass(frozen=True)
class RunCgroups:
    """One run's cgroup tree: ``rel`` (``rankpack/run-<sim>-<owner pid>``), a rank below it."""

    driver: cgroups.CgroupDriver
    rel: str

    @classmethod
    def create(
        cls,
        driver: cgroups.CgroupDriver,
        sim_id: str,
        ranks: Sequence[RankResources],
        capacity_millis: int,
    ) -> RunCgroups:
        """The tree of a run this process launches, with the ranks' CPU set. LaunchFailed
        (and nothing left behind) if a cgroup cannot be created or written."""
        run = cls(driver, f"{cgroups.SUBTREE}/run-{sim_id}-{os.getpid()}")
        try:
            driver.create(run.rel)
            driver.set_cpu(cgroups.SUBTREE, capacity_millis, None)
            driver.set_cpu(run.rel, sum(r.request_millis for r in ranks), None)
            for i, res in enumerate(ranks):
                driver.create(run.rank(i))
                driver.set_cpu(run.rank(i), res.request_millis, res.limit_millis)
        except OSError as exc:
            cgroups.remove_tree(driver, run.rel)
            raise LaunchFailed(f"cannot create the rank cgroups: {exc}") from exc
        return run

    def rank(self, i: int) -> str:
        """Rank ``i``'s cgroup (relative to the driver's root)."""
        return f"{self.rel}/rank-{i}"

    def join_dirs(self) -> str:
        """$RANKPACK_CGROUP_DIRS for `rank_launcher.sh`: where a rank writes its pid."""
        return ":".join(str(d) for d in self.driver.join_dirs(self.rel))

    def set_rank(self, i: int, resources: RankResources) -> None:
        """Resize rank ``i`` in place (OSError if the kernel refuses the write); the run's
        weight follows with `set_weight`."""
        self.driver.set_cpu(self.rank(i), resources.request_millis, resources.limit_millis)

    def set_weight(self, total_request_millis: int) -> None:
        """The run's weight: the sum of its ranks' requests (OSError if refused)."""
        self.driver.set_cpu(self.rel, total_request_millis, None)

    def settings(self, i: int) -> cgroups.CpuSettings:
        return self.driver.read_settings(self.rank(i))

    def resources(self, i: int) -> RankResources:
        """Rank ``i``'s request and limit, read back from its cgroup (OSError if gone)."""
        s = self.settings(i)
        return RankResources(cgroups.request_millis_of(s), cgroups.limit_millis_of(s))

    def stat(self, i: int) -> cgroups.CpuStat:
        return self.driver.read_stat(self.rank(i))

    def alive(self, i: int) -> bool:
        """Whether a process of rank ``i`` is in its cgroup."""
        return bool(self.driver.pids(self.rank(i)))

    def any_alive(self, n_ranks: int) -> bool:
        """Whether any rank still has a process (ranks whose cgroup is gone have none)."""
        ranks = [self.rank(i) for i in range(n_ranks)]
        return any(self.driver.pids(r) for r in ranks if self.driver.exists(r))

    def kill(self, n_ranks: int, grace_s: float = 1.0) -> None:
        """End every process left in the ranks' cgroups (those that escaped mpirun's process
        group or outlived it)."""
        for i in range(n_ranks):
            cgroups.kill_all(self.driver, self.rank(i), grace_s=grace_s)

    def remove(self) -> None:
        """Kill what is left and remove the tree."""
        cgroups.remove_tree(self.driver, self.rel)


@dataclass(frozen=True)
class RunOnMachine:
    """A run cgroup found under the rankpack subtree (this process's or another's)."""

    cgroups: RunCgroups
    sim_id: str
    owner_pid: str

    def request_millis(self) -> int:
        """The run's weight: its ranks' requests (OSError if it vanished)."""
        return cgroups.request_millis_of(self.cgroups.driver.read_settings(self.cgroups.rel))

    def n_ranks(self) -> int:
        return sum(
            1 for c in self.cgroups.driver.children(self.cgroups.rel) if c.startswith("rank-")
        )

    def running(self) -> bool:
        """Whether any process is left in any of its cgroups."""
        driver, rel = self.cgroups.driver, self.cgroups.rel
        return any(driver.pids(f"{rel}/{c}") for c in driver.children(rel))


def runs(driver: cgroups.CgroupDriver) -> Iterator[RunOnMachine]:
    """Every run cgroup on this machine, in the driver's order."""
    for name in driver.children(cgroups.SUBTREE):
        m = _RUN_CGROUP.match(name)
        if m is not None:
            run = RunCgroups(driver, f"{cgroups.SUBTREE}/{name}")
            yield RunOnMachine(run, m.group("sim"), m.group("pid"))


def others_load(driver: cgroups.CgroupDriver, ours: set[str]) -> tuple[int, int]:
    """Requested millicores and rank count of the runs whose cgroup is not in ``ours`` (those
    of other rankpack processes); a run that vanishes while read is skipped."""
    requested = ranks = 0
    for run in runs(driver):
        if run.cgroups.rel in ours:
            continue
        with contextlib.suppress(OSError):
            requested += run.request_millis()
            ranks += run.n_ranks()
    return requested, ranks
