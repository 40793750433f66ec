"""`LocalBackend`: backend protocol v2 (`rankpack.backend.protocol`) on this machine.

It ties the rooms of the local backend together: `launching` starts mpirun, `rankcgroups`
holds each run's cgroups, `observing` keeps each run's state and observes it. Staging
runs in a worker thread (`rankpack.backend.worker.Stager`), a waiter thread per launched
simulation notices its end, and `wait` wakes on the first event of any simulation.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from rankpack.backend import cgroups, ranknice
from rankpack.backend.local import launching, rankcgroups
from rankpack.backend.local.observing import LocalRun
from rankpack.backend.local.rankcgroups import RunCgroups
from rankpack.backend.mpirun import LogTail, ShimRecords, find_mpirun, stop_group
from rankpack.backend.protocol import (
    BackendError,
    Inventory,
    LaunchFailed,
    NodeCapacity,
    RankResources,
    ResizeState,
    ResizeStatus,
    SimObservation,
    SimPhase,
    SimRef,
    SimSpec,
    StageSpec,
    UnknownSimulation,
)
from rankpack.backend.worker import News, Stager
from rankpack.core.actions import WaitMode
from rankpack.errors import UserError


class LocalBackend:
    """Runs simulations on this machine, each in one cgroup weighing its ranks' requests,
    a rank's share of it its nice value (a cgroup per rank with hard limits; uncontained if
    asked)."""

    name = "local"

    def __init__(
        self,
        *,
        use_cgroups: bool = True,
        driver: cgroups.CgroupDriver | None = None,
        reap: bool = True,
    ) -> None:
        self.driver: cgroups.CgroupDriver | None = None
        if use_cgroups:
            self.driver = driver or cgroups.detect()
            cgroups.check_writable(self.driver)
            if reap:
                cgroups.reap_stale_runs(self.driver)
        self._stager = Stager(self._notify)
        self._sims: dict[str, LocalRun] = {}
        self._news = News()

    @property
    def cgroup_version(self) -> str:
        return self.driver.version if self.driver else "none"

    # -- capacity and facts ------------------------------------------------------------------

    def capacity_millis(self) -> int:
        return len(os.sched_getaffinity(0)) * 1000

    def inventory(self) -> Inventory:
        """One node: this machine. Requested CPU counts every live rankpack run on it, also
        those of other rankpack processes (their run cgroups weigh their requests)."""
        live = [s for s in self._sims.values() if not s.released]
        requested = sum(r.request_millis for s in live for r in s.desired)
        ranks = sum(len(s.desired) for s in live)
        if self.driver is not None:
            ours = {s.cgroups.rel for s in self._sims.values() if s.cgroups is not None}
            others_requested, others_ranks = rankcgroups.others_load(self.driver, ours)
            requested += others_requested
            ranks += others_ranks
        node = NodeCapacity(os.uname().nodename, self.capacity_millis(), requested, ranks,
                            rank_groups=self.driver is not None)  # fmt: skip
        return Inventory((node,))

    def placement(self) -> dict[str, str]:
        return {"cgroups": self.cgroup_version, "node": os.uname().nodename}

    def clock(self) -> float:
        return time.monotonic()

    # -- events ------------------------------------------------------------------------------

    def _notify(self) -> None:
        self._news.notify()

    def wait(self, timeout_s: float) -> None:
        self._news.wait(timeout_s)

    # -- staging -----------------------------------------------------------------------------

    def stage(self, spec: StageSpec) -> None:
        if spec.sim_id in self._sims:
            raise BackendError(f"simulation {spec.sim_id} exists already")
        self._stager.stage(spec)

    # -- launch ------------------------------------------------------------------------------

    def launch(self, spec: SimSpec) -> None:
        if spec.sim_id in self._sims:
            raise BackendError(f"simulation {spec.sim_id} was launched already")
        self._stager.launched(spec.sim_id)
        mpirun = find_mpirun(spec.mpi)
        pid_dir = launching.prepare_dirs(spec)
        env = launching.environment(spec, pid_dir)
        run: RunCgroups | None = None
        if self.driver is not None:
            run = RunCgroups.create(self.driver, spec.sim_id, spec.ranks, self.capacity_millis())
            env.update(run.launcher_env([r.request_millis for r in spec.ranks]))
        argv = launching.command(spec, mpirun, env)
        try:
            process, log_file = launching.start(spec, argv, env)
        except LaunchFailed:
            if run is not None:
                run.remove()
            raise
        sim = LocalRun(
            sim_id=spec.sim_id,
            spec=spec,
            cgroups=run,
            pid_dir=pid_dir,
            desired=list(spec.ranks),
            log=LogTail(spec.log_path),
            shim=ShimRecords.of(spec),
            process=process,
            log_file=log_file,
        )
        self._sims[spec.sim_id] = sim
        threading.Thread(target=self._watch, args=(sim,), daemon=True).start()

    def _watch(self, sim: LocalRun) -> None:
        assert sim.process is not None
        sim.exit_code = sim.process.wait()
        sim.ended = True
        self._notify()

    # -- resize and wait mode ----------------------------------------------------------------

    def resize(self, sim_id: str, rank: int, resources: RankResources) -> ResizeStatus:
        sim = self._sim(sim_id)
        if not 0 <= rank < len(sim.desired):
            raise BackendError(f"rank {rank} does not exist in {sim_id}")
        t0 = time.monotonic()
        old = sim.desired[rank]

        def settled(state: ResizeState, reason: str = "") -> ResizeStatus:
            latency = time.monotonic() - t0 if state is ResizeState.COMPLETED else None
            return ResizeStatus(state, old.request_millis, resources.request_millis, t0,
                                reason=reason, latency_s=latency)  # fmt: skip

        if resources.request_millis > self.capacity_millis():
            status = settled(
                ResizeState.REJECTED,
                f"{resources.request_millis}m is above this node's allocatable "
                f"{self.capacity_millis()}m",
            )
        elif sim.ended:
            status = settled(ResizeState.REJECTED, "the simulation has ended")
        elif sim.cgroups is None:
            status = settled(
                ResizeState.REJECTED, "this simulation runs without cgroups (--no-cgroups)"
            )
        else:
            try:
                if sim.cgroups.per_rank:
                    sim.cgroups.set_rank(rank, resources)
                    sim.desired[rank] = resources  # the rank's cgroup has it, whatever follows
                    sim.cgroups.set_weight(sum(r.request_millis for r in sim.desired))
                else:  # the group's weight first: if it is refused, nothing has changed
                    others = sum(r.request_millis for i, r in enumerate(sim.desired) if i != rank)
                    sim.cgroups.set_weight(others + resources.request_millis)
                    sim.desired[rank] = resources
                    sim.apply_nice()
            except OSError as exc:
                status = settled(ResizeState.REJECTED, f"the cgroup write was refused: {exc}")
            else:
                status = settled(ResizeState.COMPLETED)
        sim.resizes[rank] = status
        return status

    def set_wait_mode(self, sim_id: str, mode: WaitMode) -> None:
        self._sim(sim_id).shim.set_wait_mode(mode)

    def settings(self, sim_id: str, rank: int) -> cgroups.CpuSettings:
        """The cgroup values in force for a rank (for display and checks): its own cgroup's
        with hard limits, else its rank group's (the run's; its share in it is `nice`)."""
        sim = self._sim(sim_id)
        if sim.cgroups is None:
            raise UserError("this simulation runs without cgroups")
        return sim.cgroups.settings(rank)

    def nice(self, sim_id: str, rank: int) -> int | None:
        """Rank ``rank``'s nice value, its share of its rank group (None before it started
        or after it ended)."""
        pid = self._sim(sim_id).pids.get(rank)
        try:
            return ranknice.nice_of(int(pid)) if pid is not None else None
        except ProcessLookupError:
            return None

    # -- observe -----------------------------------------------------------------------------

    def observe(self, sim_id: str) -> SimObservation:
        now = time.monotonic()
        staged = self._stager.observe(sim_id, now) if sim_id not in self._sims else None
        if staged is not None:
            return staged
        return self._sim(sim_id).observe(now)

    # -- stop and release ----------------------------------------------------------------------

    def stop(self, sim_id: str) -> None:
        if sim_id not in self._sims and self._stager.cancel(sim_id):
            return
        sim = self._sims.get(sim_id)
        if sim is None:
            raise UnknownSimulation(f"no simulation {sim_id} in this backend")
        if sim.released:
            return
        sim.stopped = True
        if sim.process is not None:
            stop_group(sim.process)
            sim.exit_code = sim.process.returncode
        # Ranks that escaped the process group (or outlived mpirun) are still in their cgroups.
        if sim.cgroups is not None:
            sim.cgroups.kill(len(sim.desired), grace_s=1.0)
        else:
            for pid_file in sim.pid_dir.glob("rank-*.pid"):
                with contextlib.suppress(ValueError, ProcessLookupError, FileNotFoundError):
                    os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        sim.ended = True
        self._notify()

    def release(self, sim_id: str) -> None:
        if sim_id not in self._sims and self._stager.release(sim_id):
            return  # staged but never launched: the copy holds no results and is removed
        sim = self._sims.get(sim_id)
        if sim is None or sim.released:
            return
        self.stop(sim_id)
        if sim.cgroups is not None:
            sim.cgroups.remove()
        if sim.log_file is not None:
            sim.log_file.close()
        sim.shim.close()
        sim.released = True

    # -- earlier processes' simulations ------------------------------------------------------

    def list(self) -> tuple[SimRef, ...]:
        refs = [
            SimRef(s.sim_id, SimPhase.FAILED if s.ended else SimPhase.RUNNING, s.spec.labels)
            for s in self._sims.values()
            if not s.released
        ]
        known = {r.sim_id for r in refs}
        if self.driver is not None:
            for run in rankcgroups.runs(self.driver):
                if run.sim_id in known:
                    continue
                phase = SimPhase.RUNNING if run.running() else SimPhase.SUCCEEDED
                refs.append(SimRef(run.sim_id, phase, {"owner_pid": run.owner_pid}))
        return tuple(refs)

    def adopt(self, sim_id: str, spec: SimSpec) -> None:
        """Take over the cgroups of a simulation another rankpack process launched. Its
        mpirun is not our child: its end is seen when its cgroups empty."""
        if self.driver is None:
            raise BackendError("adopting needs cgroups")
        found = [r for r in rankcgroups.runs(self.driver) if r.sim_id == sim_id]
        if not found:
            raise UnknownSimulation(f"no simulation {sim_id} on this machine")
        run = found[0].cgroups
        sim = LocalRun(
            sim_id=sim_id,
            spec=spec,
            cgroups=run,
            pid_dir=launching.pid_dir(spec.case_dir),
            desired=list(spec.ranks),
            log=LogTail(spec.log_path),
            shim=ShimRecords.of(spec),
        )
        for i in range(len(sim.desired) if run.per_rank else 0):
            with contextlib.suppress(OSError):
                sim.desired[i] = run.resources(i)
        with contextlib.suppress(OSError):
            sim.log.offset = spec.log_path.stat().st_size
        self._sims[sim_id] = sim
        threading.Thread(target=self._watch_adopted, args=(sim, run), daemon=True).start()

    def _watch_adopted(self, sim: LocalRun, run: RunCgroups) -> None:
        while not sim.ended:
            if not run.any_alive(len(sim.desired)):
                sim.ended = True
                self._notify()
                return
            time.sleep(0.2)

    def _sim(self, sim_id: str) -> LocalRun:
        sim = self._sims.get(sim_id)
        if sim is None or sim.released:
            raise UnknownSimulation(f"no simulation {sim_id} in this backend")
        return sim
