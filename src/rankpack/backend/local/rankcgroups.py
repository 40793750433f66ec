"""The cgroups of a local run: the machine's rank group.

A run launched by rankpack process P is the cgroup ``rankpack/run-<sim>-<P>``. Like the
kubelet, the ``rankpack`` parent weighs the machine's CPUs (kubepods = allocatable) and a
run weighs the sum of its ranks' requests, so a run competes with the rest of the host as a
pod would on a node. By default its ranks are in that one cgroup (a *rank group*) and each
rank's share of it is its nice value (`rankpack.backend.ranknice`, set by the backend): a
rank waiting in MPI can then yield its core to a peer, which it cannot across cgroups
(docs/decisions/0012-rank-groups.md). A run with hard limits has a cgroup per rank,
``rank-<i>`` below the run's (a limit is a quota, which only a cgroup holds). Resizing is a
write to the cgroup files (or a nice value), complete when the write returns.

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

from rankpack.backend import cgroups, ranknice
from rankpack.backend.protocol import LaunchFailed, RankResources

_RUN_CGROUP = re.compile(r"^run-(?P<sim>.+)-(?P<pid>\d+)$")


@dataclass(frozen=True)
class RunCgroups:
    """One run's cgroups: ``rel`` (``rankpack/run-<sim>-<owner pid>``) and, if ``per_rank``
    (a run with hard limits), a cgroup per rank below it; otherwise the ranks are in ``rel``."""

    driver: cgroups.CgroupDriver
    rel: str
    per_rank: bool = False

    @classmethod
    def create(
        cls,
        driver: cgroups.CgroupDriver,
        sim_id: str,
        ranks: Sequence[RankResources],
        capacity_millis: int,
    ) -> RunCgroups:
        """The cgroups of a run this process launches, with the ranks' CPU set (a cgroup per
        rank only if a rank has a limit). LaunchFailed (and nothing left behind) if a cgroup
        cannot be created or written."""
        per_rank = any(r.limit_millis is not None for r in ranks)
        run = cls(driver, f"{cgroups.SUBTREE}/run-{sim_id}-{os.getpid()}", per_rank)
        try:
            driver.create(run.rel)
            driver.set_cpu(cgroups.SUBTREE, capacity_millis, None)
            driver.set_cpu(run.rel, sum(r.request_millis for r in ranks), None)
            for i, res in enumerate(ranks if per_rank else ()):
                driver.create(run.rank(i))
                driver.set_cpu(run.rank(i), res.request_millis, res.limit_millis)
        except OSError as exc:
            cgroups.remove_tree(driver, run.rel)
            raise LaunchFailed(f"cannot create the rank cgroups: {exc}") from exc
        return run

    def rank(self, i: int) -> str:
        """The cgroup rank ``i`` is in (relative to the driver's root): its own if
        ``per_rank``, else the run's."""
        return f"{self.rel}/rank-{i}" if self.per_rank else self.rel

    def launcher_env(self, requests_millis: Sequence[int]) -> dict[str, str]:
        """What `rank_launcher.sh` needs to join and weigh its rank: $RANKPACK_CGROUP_DIRS
        (the run's directories) and, for a cgroup per rank, $RANKPACK_CGROUP_PER_RANK; for a
        rank group, each rank's nice value from these requests ($RANKPACK_RANK_NICE)."""
        env = {"RANKPACK_CGROUP_DIRS": ":".join(str(d) for d in self.driver.join_dirs(self.rel))}
        if self.per_rank:
            env["RANKPACK_CGROUP_PER_RANK"] = "1"
        else:
            env["RANKPACK_RANK_NICE"] = ",".join(str(n) for n in ranknice.nices(requests_millis))
        return env

    def set_rank(self, i: int, resources: RankResources) -> None:
        """Resize rank ``i``'s own cgroup in place (``per_rank`` runs; OSError if the kernel
        refuses the write); the run's weight follows with `set_weight`."""
        if not self.per_rank:
            raise ValueError("the ranks of a rank group have no cgroup of their own")
        self.driver.set_cpu(self.rank(i), resources.request_millis, resources.limit_millis)

    def set_weight(self, total_request_millis: int) -> None:
        """The run's weight: the sum of its ranks' requests (OSError if refused)."""
        self.driver.set_cpu(self.rel, total_request_millis, None)

    def settings(self, i: int) -> cgroups.CpuSettings:
        """The cgroup values rank ``i`` is under (the run's own for a rank group)."""
        return self.driver.read_settings(self.rank(i))

    def resources(self, i: int) -> RankResources:
        """Rank ``i``'s request and limit, read back from its own cgroup (``per_rank``;
        OSError if gone)."""
        s = self.settings(i)
        return RankResources(cgroups.request_millis_of(s), cgroups.limit_millis_of(s))

    def stat(self, i: int) -> cgroups.CpuStat:
        """The counters of the cgroup rank ``i`` is in (its own only if ``per_rank``)."""
        return self.driver.read_stat(self.rank(i))

    def alive(self, i: int) -> bool:
        """Whether a process is in rank ``i``'s cgroup (any rank's, for a rank group)."""
        return bool(self.driver.pids(self.rank(i)))

    def any_alive(self, n_ranks: int) -> bool:
        """Whether any rank still has a process (ranks whose cgroup is gone have none)."""
        ranks = {self.rank(i) for i in range(n_ranks)}
        return any(self.driver.pids(r) for r in ranks if self.driver.exists(r))

    def kill(self, n_ranks: int, grace_s: float = 1.0) -> None:
        """End every process left in the ranks' cgroups (those that escaped mpirun's process
        group or outlived it)."""
        for rel in sorted({self.rank(i) for i in range(n_ranks)}):
            cgroups.kill_all(self.driver, rel, grace_s=grace_s)

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
        """Its ranks: its rank cgroups, or the processes of a rank group (each rank is one
        process in it; 0 before they start)."""
        driver, rel = self.cgroups.driver, self.cgroups.rel
        if self.cgroups.per_rank:
            return sum(1 for c in driver.children(rel) if c.startswith("rank-"))
        return len(driver.pids(rel))

    def running(self) -> bool:
        """Whether any process is left in any of its cgroups."""
        driver, rel = self.cgroups.driver, self.cgroups.rel
        children = (f"{rel}/{c}" for c in driver.children(rel))
        return bool(driver.pids(rel)) or any(driver.pids(c) for c in children)


def runs(driver: cgroups.CgroupDriver) -> Iterator[RunOnMachine]:
    """Every run cgroup on this machine, in the driver's order."""
    for name in driver.children(cgroups.SUBTREE):
        m = _RUN_CGROUP.match(name)
        if m is not None:
            rel = f"{cgroups.SUBTREE}/{name}"
            per_rank = any(c.startswith("rank-") for c in driver.children(rel))
            run = RunCgroups(driver, rel, per_rank)
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
