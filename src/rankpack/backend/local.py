"""The local backend: every MPI rank in its own cgroup on this machine ("rank pods").

`mpirun` (Open MPI by default) starts `rank_launcher.sh` once per rank; the launcher writes
its pid into ``rankpack/run-<sim>-<owner pid>/rank-<i>/cgroup.procs`` and execs the solver,
so the rank is contained before its first instruction. Resizing is a write to the rank's
cgroup files, exactly what the kubelet does for an in-place pod resize.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from rankpack.backend import cgroups
from rankpack.backend.protocol import (
    RankObservation,
    RankResources,
    SimHandle,
    SimObservation,
    SimSpec,
)
from rankpack.errors import UserError

CLK_TCK = os.sysconf("SC_CLK_TCK")


def launcher_path() -> Path:
    path = Path(str(resources.files("rankpack.backend") / "rank_launcher.sh"))
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


def find_mpirun(flavour: str = "openmpi") -> str:
    """The mpirun of the MPI the solver was built with; $RANKPACK_MPIRUN overrides."""
    explicit = os.environ.get("RANKPACK_MPIRUN")
    if explicit:
        return explicit
    names = (
        ("mpirun.openmpi", "mpirun") if flavour == "openmpi" else ("mpirun.mpich", "mpiexec.hydra")
    )
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise UserError(
        f"no {flavour} mpirun found; install it (apt-get install openmpi-bin) "
        "or set RANKPACK_MPIRUN"
    )


def mpirun_argv(mpirun: str, flavour: str, n_ranks: int, env_names: list[str]) -> list[str]:
    if flavour == "openmpi":
        argv = [mpirun, "-np", str(n_ranks), "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        for name in env_names:
            argv += ["-x", name]
        return argv
    return (
        [mpirun, "-np", str(n_ranks), "-envlist", ",".join(env_names)]
        if env_names
        else [
            mpirun,
            "-np",
            str(n_ranks),
        ]
    )


@dataclass
class LocalSim:
    sim_id: str
    spec: SimSpec
    process: subprocess.Popen[bytes]
    cgroup_rel: str | None
    pid_dir: Path
    resources: list[RankResources]
    log_file: object = field(repr=False)
    exit_code: int | None = None
    released: bool = False
    last_usage_ns: dict[int, int] = field(default_factory=dict)
    """Uncontained mode: the last /proc reading per rank (kept after the process exits)."""


class LocalBackend:
    """Runs simulations on this machine, one cgroup per rank (or uncontained if asked)."""

    name = "local"

    def __init__(
        self,
        *,
        use_cgroups: bool = True,
        driver: cgroups.CgroupDriver | None = None,
        mpi: str = "openmpi",
    ) -> None:
        self.mpi = mpi
        self.driver: cgroups.CgroupDriver | None = None
        if use_cgroups:
            self.driver = driver or cgroups.detect()
            cgroups.check_writable(self.driver)
            cgroups.reap_stale_runs(self.driver)

    @property
    def cgroup_version(self) -> str:
        return self.driver.version if self.driver else "none"

    def capacity_millis(self) -> int:
        return len(os.sched_getaffinity(0)) * 1000

    # -- actions ---------------------------------------------------------------------------

    def launch(self, spec: SimSpec) -> LocalSim:
        mpirun = find_mpirun(self.mpi)
        pid_dir = spec.case_dir / ".rankpack" / "pids"
        pid_dir.mkdir(parents=True, exist_ok=True)
        for stale in pid_dir.glob("rank-*.pid"):
            stale.unlink()
        env = dict(os.environ)
        env.update(spec.env)
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
            except BaseException:
                cgroups.remove_tree(self.driver, cgroup_rel)
                raise
            env["RANKPACK_CGROUP_DIRS"] = ":".join(
                str(d) for d in self.driver.join_dirs(cgroup_rel)
            )
        else:
            env.pop("RANKPACK_CGROUP_DIRS", None)
        if self.mpi == "openmpi" and os.geteuid() == 0:
            env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
            env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        forwarded = sorted({"RANKPACK_PID_DIR", "RANKPACK_CGROUP_DIRS", *spec.env} & set(env))
        argv = mpirun_argv(mpirun, self.mpi, len(spec.ranks), forwarded)
        argv += [str(launcher_path()), *spec.command]
        log_file = open(spec.log_path, "ab")  # noqa: SIM115 - closed in release()
        try:
            process = subprocess.Popen(
                argv,
                cwd=spec.case_dir,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_terminate_with_parent,
            )
        except BaseException:
            log_file.close()
            if self.driver is not None and cgroup_rel is not None:
                cgroups.remove_tree(self.driver, cgroup_rel)
            raise
        return LocalSim(
            sim_id=spec.sim_id,
            spec=spec,
            process=process,
            cgroup_rel=cgroup_rel,
            pid_dir=pid_dir,
            resources=list(spec.ranks),
            log_file=log_file,
        )

    def resize(self, handle: SimHandle, rank: int, resources: RankResources) -> None:
        sim = _local(handle)
        if self.driver is None or sim.cgroup_rel is None:
            raise UserError("cannot resize a rank that runs without cgroups (--no-cgroups)")
        if not 0 <= rank < len(sim.resources):
            raise UserError(f"rank {rank} does not exist in {sim.sim_id}")
        self.driver.set_cpu(
            f"{sim.cgroup_rel}/rank-{rank}", resources.request_millis, resources.limit_millis
        )
        sim.resources[rank] = resources
        self.driver.set_cpu(sim.cgroup_rel, sum(r.request_millis for r in sim.resources), None)

    def observe(self, handle: SimHandle) -> SimObservation:
        sim = _local(handle)
        if sim.exit_code is None:
            sim.exit_code = sim.process.poll()
        now = time.monotonic()
        ranks = []
        for i, res in enumerate(sim.resources):
            if self.driver is not None and sim.cgroup_rel is not None:
                stat = self.driver.read_stat(f"{sim.cgroup_rel}/rank-{i}")
                usage, nthr, thr_ns = stat.usage_ns, stat.nr_throttled, stat.throttled_ns
            else:
                usage = max(
                    _proc_usage_ns(sim.pid_dir / f"rank-{i}.pid"), sim.last_usage_ns.get(i, 0)
                )
                sim.last_usage_ns[i] = usage
                nthr, thr_ns = 0, 0
            ranks.append(
                RankObservation(
                    rank=i,
                    usage_ns=usage,
                    nr_throttled=nthr,
                    throttled_ns=thr_ns,
                    request_millis=res.request_millis,
                    limit_millis=res.limit_millis,
                )
            )
        return SimObservation(sim.sim_id, now, tuple(ranks), sim.exit_code)

    def stop(self, handle: SimHandle) -> None:
        sim = _local(handle)
        if sim.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sim.process.pid, signal.SIGTERM)
            try:
                sim.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(sim.process.pid, signal.SIGKILL)
                sim.process.wait(timeout=5)
        sim.exit_code = sim.process.returncode
        # Ranks that escaped the process group (or outlived mpirun) are still in their cgroups.
        if self.driver is not None and sim.cgroup_rel is not None:
            for i in range(len(sim.resources)):
                cgroups.kill_all(self.driver, f"{sim.cgroup_rel}/rank-{i}", grace_s=1.0)
        else:
            for pid_file in sim.pid_dir.glob("rank-*.pid"):
                with contextlib.suppress(ValueError, ProcessLookupError, FileNotFoundError):
                    os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)

    def wait(self, handle: SimHandle, timeout_s: float) -> int | None:
        sim = _local(handle)
        try:
            sim.exit_code = sim.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        return sim.exit_code

    def release(self, handle: SimHandle) -> None:
        sim = _local(handle)
        if sim.released:
            return
        self.stop(sim)
        if self.driver is not None and sim.cgroup_rel is not None:
            cgroups.remove_tree(self.driver, sim.cgroup_rel)
        sim.log_file.close()  # type: ignore[attr-defined]
        sim.released = True

    def settings(self, handle: SimHandle, rank: int) -> cgroups.CpuSettings:
        """The cgroup values in force for a rank (for display and checks)."""
        sim = _local(handle)
        if self.driver is None or sim.cgroup_rel is None:
            raise UserError("this simulation runs without cgroups")
        return self.driver.read_settings(f"{sim.cgroup_rel}/rank-{rank}")


_PR_SET_PDEATHSIG = 1


def _terminate_with_parent() -> None:
    """In the forked child: SIGTERM mpirun if rankpack dies (even by SIGKILL).

    mpirun then takes its ranks down; anything left behind is reaped from its cgroup by the
    next rankpack process (`cgroups.reap_stale_runs`).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _local(handle: SimHandle) -> LocalSim:
    if not isinstance(handle, LocalSim):
        raise TypeError(f"not a local simulation handle: {handle!r}")
    return handle


def _proc_usage_ns(pid_file: Path) -> int:
    try:
        pid = int(pid_file.read_text().strip())
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return 0
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) * 1_000_000_000 // CLK_TCK
