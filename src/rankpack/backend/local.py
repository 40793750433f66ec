"""The local backend: every MPI rank in its own cgroup on this machine ("rank pods").

`mpirun` (Open MPI by default) starts `rank_launcher.sh` once per rank; the launcher writes
its pid into ``rankpack/run-<sim>-<owner pid>/rank-<i>/cgroup.procs`` and execs the solver,
so the rank is contained before its first instruction. Resizing is a write to the rank's
cgroup files, exactly what the kubelet does for an in-place pod resize, so a resize is
complete when the write returns.

Implements backend protocol v2 (`rankpack.backend.protocol`): staging runs in a worker
thread, a waiter thread per launched simulation notices its end, and `wait` wakes on the
first event of any simulation. The backend reads the solver log, the cgroup counters and
the PMPI shim's memory-mapped records itself and delivers them in observations.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO

from rankpack.backend import cgroups
from rankpack.backend.mpirun import (
    LogTail,
    MpirunProcess,
    ShimRecords,
    exit_failure,
    find_mpirun,
    root_env,
    shim_dir,
    stop_group,
)
from rankpack.backend.protocol import (
    BackendError,
    Inventory,
    LaunchFailed,
    NodeCapacity,
    RankObservation,
    RankPhase,
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
from rankpack.errors import UserError
from rankpack.profile.shim import shim_env

__all__ = ["LocalBackend", "find_mpirun", "launcher_path", "mpirun_argv", "shim_dir"]
"""`find_mpirun` and `shim_dir` live in `rankpack.backend.mpirun`; they stay importable from
here for the modules that imported them from this one."""

CLK_TCK = os.sysconf("SC_CLK_TCK")
_RUN_CGROUP = re.compile(r"^run-(?P<sim>.+)-(?P<pid>\d+)$")


def launcher_path() -> Path:
    path = Path(str(resources.files("rankpack.backend") / "rank_launcher.sh"))
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


def mpirun_argv(mpirun: str, flavour: str, n_ranks: int, env_names: list[str]) -> list[str]:
    if flavour == "openmpi":
        argv = [mpirun, "-np", str(n_ranks), "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        for name in env_names:
            argv += ["-x", name]
        return argv
    argv = [mpirun, "-np", str(n_ranks)]
    if env_names:
        argv += ["-envlist", ",".join(env_names)]
    return argv


@dataclass
class _Sim:
    sim_id: str
    spec: SimSpec
    cgroup_rel: str | None
    pid_dir: Path
    desired: list[RankResources]
    log: LogTail
    shim: ShimRecords
    process: MpirunProcess | None = None
    """None for a simulation adopted from an earlier rankpack process."""
    log_file: IO[bytes] | None = field(default=None, repr=False)
    exit_code: int | None = None
    ended: bool = False
    released: bool = False
    pids: dict[int, str] = field(default_factory=dict)
    restarts: dict[int, int] = field(default_factory=dict)
    resizes: dict[int, ResizeStatus] = field(default_factory=dict)
    last_usage_ns: dict[int, int] = field(default_factory=dict)
    stopped: bool = False


class LocalBackend:
    """Runs simulations on this machine, one cgroup per rank (or uncontained if asked)."""

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
        self._sims: dict[str, _Sim] = {}
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
            ours = {s.cgroup_rel for s in self._sims.values()}
            for name in self.driver.children(cgroups.SUBTREE):
                rel = f"{cgroups.SUBTREE}/{name}"
                if _RUN_CGROUP.match(name) is None or rel in ours:
                    continue
                with contextlib.suppress(OSError):
                    requested += cgroups.request_millis_of(self.driver.read_settings(rel))
                    ranks += sum(1 for c in self.driver.children(rel) if c.startswith("rank-"))
        node = NodeCapacity(os.uname().nodename, self.capacity_millis(), requested, ranks)
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
        pid_dir = spec.case_dir / ".rankpack" / "pids"
        pid_dir.mkdir(parents=True, exist_ok=True)
        for stale in pid_dir.glob("rank-*.pid"):
            stale.unlink()
        env = dict(os.environ)
        env.update(spec.env)
        if spec.shim is not None:
            live = shim_dir(spec.case_dir)
            live.mkdir(parents=True, exist_ok=True)
            env.update(shim_env(live, spec.shim.wait_mode, flavour=spec.shim.flavour))
        env["RANKPACK_PID_DIR"] = str(pid_dir)
        cgroup_rel: str | None = None
        if self.driver is not None:
            cgroup_rel = f"{cgroups.SUBTREE}/run-{spec.sim_id}-{os.getpid()}"
            try:
                # Like the kubelet: the parent of all rank pods weighs the machine's CPUs
                # (kubepods = allocatable) and a run weighs the sum of its ranks' requests,
                # so rank pods compete with the rest of the host as they would on a node.
                self.driver.create(cgroup_rel)
                self.driver.set_cpu(cgroups.SUBTREE, self.capacity_millis(), None)
                self.driver.set_cpu(cgroup_rel, sum(r.request_millis for r in spec.ranks), None)
                for i, res in enumerate(spec.ranks):
                    rel = f"{cgroup_rel}/rank-{i}"
                    self.driver.create(rel)
                    self.driver.set_cpu(rel, res.request_millis, res.limit_millis)
            except OSError as exc:
                cgroups.remove_tree(self.driver, cgroup_rel)
                raise LaunchFailed(f"cannot create the rank cgroups: {exc}") from exc
            env["RANKPACK_CGROUP_DIRS"] = ":".join(
                str(d) for d in self.driver.join_dirs(cgroup_rel)
            )
        else:
            env.pop("RANKPACK_CGROUP_DIRS", None)
        env.update(root_env(spec.mpi))
        forwarded_names = {"RANKPACK_PID_DIR", "RANKPACK_CGROUP_DIRS", *spec.env}
        if spec.shim is not None:
            forwarded_names |= {k for k in env if k.startswith("RANKPACK_SHIM_")} | {"LD_PRELOAD"}
        forwarded = sorted(forwarded_names & set(env))
        argv = mpirun_argv(mpirun, spec.mpi, len(spec.ranks), forwarded)
        argv += [str(launcher_path()), *spec.command]
        log_file = open(spec.log_path, "ab")  # noqa: SIM115 - closed in release()
        try:
            process = MpirunProcess(argv, spec.case_dir, env, log_file)
        except OSError as exc:
            log_file.close()
            if self.driver is not None and cgroup_rel is not None:
                cgroups.remove_tree(self.driver, cgroup_rel)
            raise LaunchFailed(f"cannot start {argv[0]}: {exc}") from exc
        sim = _Sim(
            sim_id=spec.sim_id,
            spec=spec,
            cgroup_rel=cgroup_rel,
            pid_dir=pid_dir,
            desired=list(spec.ranks),
            log=LogTail(spec.log_path),
            shim=ShimRecords.of(spec),
            process=process,
            log_file=log_file,
        )
        self._sims[spec.sim_id] = sim
        threading.Thread(target=self._watch, args=(sim,), daemon=True).start()

    def _watch(self, sim: _Sim) -> None:
        assert sim.process is not None
        sim.exit_code = sim.process.wait()
        sim.ended = True
        self._notify()

    # -- resize ------------------------------------------------------------------------------

    def resize(self, sim_id: str, rank: int, resources: RankResources) -> ResizeStatus:
        sim = self._sim(sim_id)
        if not 0 <= rank < len(sim.desired):
            raise BackendError(f"rank {rank} does not exist in {sim_id}")
        t0 = time.monotonic()
        old = sim.desired[rank]
        if resources.request_millis > self.capacity_millis():
            status = ResizeStatus(
                ResizeState.REJECTED, old.request_millis, resources.request_millis, t0,
                reason=f"{resources.request_millis}m is above this node's allocatable "
                f"{self.capacity_millis()}m",
            )  # fmt: skip
        elif sim.ended:
            status = ResizeStatus(
                ResizeState.REJECTED, old.request_millis, resources.request_millis, t0,
                reason="the simulation has ended",
            )  # fmt: skip
        elif self.driver is None or sim.cgroup_rel is None:
            status = ResizeStatus(
                ResizeState.REJECTED, old.request_millis, resources.request_millis, t0,
                reason="this simulation runs without cgroups (--no-cgroups)",
            )  # fmt: skip
        else:
            try:
                self.driver.set_cpu(
                    f"{sim.cgroup_rel}/rank-{rank}",
                    resources.request_millis,
                    resources.limit_millis,
                )
                sim.desired[rank] = resources
                self.driver.set_cpu(
                    sim.cgroup_rel, sum(r.request_millis for r in sim.desired), None
                )
            except OSError as exc:
                status = ResizeStatus(
                    ResizeState.REJECTED, old.request_millis, resources.request_millis, t0,
                    reason=f"the cgroup write was refused: {exc}",
                )  # fmt: skip
            else:
                status = ResizeStatus(
                    ResizeState.COMPLETED, old.request_millis, resources.request_millis, t0,
                    latency_s=time.monotonic() - t0,
                )  # fmt: skip
        sim.resizes[rank] = status
        return status

    # -- wait mode ---------------------------------------------------------------------------

    def set_wait_mode(self, sim_id: str, mode: str) -> None:
        self._sim(sim_id).shim.set_wait_mode(mode)

    def settings(self, sim_id: str, rank: int) -> cgroups.CpuSettings:
        """The cgroup values in force for a rank (for display and checks)."""
        sim = self._sim(sim_id)
        if self.driver is None or sim.cgroup_rel is None:
            raise UserError("this simulation runs without cgroups")
        return self.driver.read_settings(f"{sim.cgroup_rel}/rank-{rank}")

    # -- observe -----------------------------------------------------------------------------

    def observe(self, sim_id: str) -> SimObservation:
        now = time.monotonic()
        staged = self._stager.observe(sim_id, now) if sim_id not in self._sims else None
        if staged is not None:
            return staged
        sim = self._sim(sim_id)
        if sim.process is not None and sim.exit_code is None:
            sim.exit_code = sim.process.poll()
            sim.ended = sim.exit_code is not None
        ended = sim.ended
        ranks = tuple(self._observe_rank(sim, i, ended) for i in range(len(sim.desired)))
        log_text = sim.log.read(ended=sim.ended)
        if not ended:
            phase, reason = (SimPhase.RUNNING if sim.pids else SimPhase.PENDING), ""
        elif not sim.stopped and (
            sim.exit_code == 0 or (sim.process is None and sim.exit_code is None)
        ):
            phase, reason = SimPhase.SUCCEEDED, ""
        else:
            failure = exit_failure(sim.exit_code, stopped=sim.stopped)
            phase, reason = SimPhase.FAILED, failure.message if failure else ""
        return SimObservation(
            sim_id, now, phase, ranks, exit_code=sim.exit_code, reason=reason, log_text=log_text
        )

    def _observe_rank(self, sim: _Sim, i: int, ended: bool) -> RankObservation:
        pid = _read_pid(sim.pid_dir / f"rank-{i}.pid")
        if pid is not None:
            if i in sim.pids and sim.pids[i] != pid:
                sim.restarts[i] = sim.restarts.get(i, 0) + 1
            sim.pids[i] = pid
        if self.driver is not None and sim.cgroup_rel is not None:
            stat = self.driver.read_stat(f"{sim.cgroup_rel}/rank-{i}")
            usage, nthr, thr_ns = stat.usage_ns, stat.nr_throttled, stat.throttled_ns
            alive = bool(self.driver.pids(f"{sim.cgroup_rel}/rank-{i}"))
        else:
            usage = max(_proc_usage_ns(pid), sim.last_usage_ns.get(i, 0))
            sim.last_usage_ns[i] = usage
            nthr, thr_ns = 0, 0
            alive = pid is not None and _pid_alive(pid)
        if ended:
            phase = RankPhase.SUCCEEDED if sim.exit_code in (0, None) else RankPhase.FAILED
        else:
            phase = RankPhase.RUNNING if alive else RankPhase.PENDING
        shim = sim.shim.sample(i)
        desired = sim.desired[i]
        return RankObservation(
            rank=i,
            phase=phase,
            desired=desired,
            allocated=desired if sim.cgroup_rel is not None else None,
            usage_ns=usage,
            nr_throttled=nthr,
            throttled_ns=thr_ns,
            restarts=sim.restarts.get(i, 0),
            node=os.uname().nodename,
            pod=f"{sim.cgroup_rel}/rank-{i}" if sim.cgroup_rel else None,
            resize=sim.resizes.get(i),
            compute_ns=shim.compute_ns,
            mpi_ns=shim.mpi_ns,
            duty_window=shim.duty_window,
            wait_mode=shim.wait_mode,
        )

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
        process = sim.process
        if process is not None:
            stop_group(process)
            sim.exit_code = process.returncode
        # Ranks that escaped the process group (or outlived mpirun) are still in their cgroups.
        if self.driver is not None and sim.cgroup_rel is not None:
            for i in range(len(sim.desired)):
                cgroups.kill_all(self.driver, f"{sim.cgroup_rel}/rank-{i}", grace_s=1.0)
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
        if self.driver is not None and sim.cgroup_rel is not None:
            cgroups.remove_tree(self.driver, sim.cgroup_rel)
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
            for name in self.driver.children(cgroups.SUBTREE):
                m = _RUN_CGROUP.match(name)
                if m is None or m.group("sim") in known:
                    continue
                rel = f"{cgroups.SUBTREE}/{name}"
                running = any(self.driver.pids(f"{rel}/{c}") for c in self.driver.children(rel))
                phase = SimPhase.RUNNING if running else SimPhase.SUCCEEDED
                refs.append(SimRef(m.group("sim"), phase, {"owner_pid": m.group("pid")}))
        return tuple(refs)

    def adopt(self, sim_id: str, spec: SimSpec) -> None:
        """Take over the cgroups of a simulation another rankpack process launched. Its
        mpirun is not our child: its end is seen when the rank cgroups empty."""
        if self.driver is None:
            raise BackendError("adopting needs cgroups")
        match = [
            n for n in self.driver.children(cgroups.SUBTREE)
            if (m := _RUN_CGROUP.match(n)) is not None and m.group("sim") == sim_id
        ]  # fmt: skip
        if not match:
            raise UnknownSimulation(f"no simulation {sim_id} on this machine")
        rel = f"{cgroups.SUBTREE}/{match[0]}"
        sim = _Sim(
            sim_id=sim_id,
            spec=spec,
            cgroup_rel=rel,
            pid_dir=spec.case_dir / ".rankpack" / "pids",
            desired=list(spec.ranks),
            log=LogTail(spec.log_path),
            shim=ShimRecords.of(spec),
        )
        for i in range(len(sim.desired)):
            with contextlib.suppress(OSError):
                s = self.driver.read_settings(f"{rel}/rank-{i}")
                sim.desired[i] = RankResources(
                    cgroups.request_millis_of(s), cgroups.limit_millis_of(s)
                )
        with contextlib.suppress(OSError):
            sim.log.offset = spec.log_path.stat().st_size
        self._sims[sim_id] = sim
        threading.Thread(target=self._watch_adopted, args=(sim,), daemon=True).start()

    def _watch_adopted(self, sim: _Sim) -> None:
        assert self.driver is not None and sim.cgroup_rel is not None
        while not sim.ended:
            ranks = [f"{sim.cgroup_rel}/rank-{i}" for i in range(len(sim.desired))]
            if not any(self.driver.pids(r) for r in ranks if self.driver.exists(r)):
                sim.ended = True
                self._notify()
                return
            time.sleep(0.2)

    def _sim(self, sim_id: str) -> _Sim:
        sim = self._sims.get(sim_id)
        if sim is None or sim.released:
            raise UnknownSimulation(f"no simulation {sim_id} in this backend")
        return sim


def _read_pid(pid_file: Path) -> str | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return text or None


def _pid_alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _proc_usage_ns(pid: str | None) -> int:
    if pid is None:
        return 0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ValueError, ProcessLookupError, IndexError):
        return 0
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) * 1_000_000_000 // CLK_TCK
