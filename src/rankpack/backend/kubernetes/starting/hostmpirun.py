"""mpirun on this host for the rank pods: the files it needs, starting it, following it.

The poller calls `MpirunHost.start` once every rank pod of a simulation runs: the hostfile,
the rsh agent (`rsh`) and the shim's library are on the case volume (`prepare_files`, at
launch), the launch marker (`exitwrapper`) makes sure mpirun is started once across processes,
and a thread per mpirun waits for its end. `kill_in_pods` takes down ranks that outlive it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import sys
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import IO

from rankpack import untrusted
from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import ApiError, KubeApi, Obj
from rankpack.backend.kubernetes.objects import builders, status
from rankpack.backend.kubernetes.objects.grouppods import group_hostfile
from rankpack.backend.kubernetes.objects.groups import group_nices
from rankpack.backend.kubernetes.record import SimRecord, rank_dir
from rankpack.backend.kubernetes.starting import exitwrapper, mpirunargs, rsh
from rankpack.backend.mpirun import (
    MpirunProcess,
    Proc,
    final_dir,
    find_mpirun,
    prepare_final_dir,
    root_env,
    version_of,
)
from rankpack.backend.protocol import BackendError, LaunchFailed
from rankpack.core.failures import Failure, FailureCode
from rankpack.errors import UserError
from rankpack.profile.shim import shim_env

C = builders.CONTAINER
RANK_LAUNCHER = "rank-launcher"
"""``rank_launcher.sh``'s copy in `rank_dir` (the rank pods run it from the case volume)."""


def _mpirun_process(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    log: IO[bytes],
    *,
    detach_exit_file: Path | None,
    lock_fd: int | None,
) -> Proc:
    """mpirun as our child (ended with us), or detached under `exitwrapper`, which outlives
    this process and writes mpirun's exit code into ``detach_exit_file``."""
    if detach_exit_file is not None:
        lock = ["--lock-fd", str(lock_fd)] if lock_fd is not None else []
        argv = [sys.executable, "-m", "rankpack.backend.kubernetes.starting.exitwrapper",
                str(detach_exit_file), *lock, "--", *argv]  # fmt: skip
    return MpirunProcess(
        argv, cwd, env, log, with_parent=detach_exit_file is None,
        pass_fds=(lock_fd,) if lock_fd is not None else (),
    )  # fmt: skip


Starter = Callable[[list[str], Path, dict[str, str], IO[bytes]], Proc]


def _popen(exit_file: Path | None, lock_fd: int | None) -> Starter:
    def start(argv: list[str], cwd: Path, env: dict[str, str], log: IO[bytes]) -> Proc:
        return _mpirun_process(argv, cwd, env, log, detach_exit_file=exit_file, lock_fd=lock_fd)

    return start


def prepare_files(sim: SimRecord) -> None:
    """Hostfile (a line per group pod, as many slots as it has ranks), rsh agent, rank
    launcher, shim library and the directory of the ranks' final records (which outlive
    their pods) on the case volume (paths the pods share); the shim's live records and the
    ranks' pid files are not there but in each group pod's own volume."""
    d = rank_dir(sim.spec.case_dir)
    try:
        # the run directory is the user's (its case, its ranks' files): what stands at these
        # names is replaced, never followed (`untrusted`)
        untrusted.own_dir(d)
        hostfile = group_hostfile(sim.spec.sim_id, sim.groups, sim.spec.mpi)
        untrusted.write_file(d / "hostfile", hostfile.encode())
        source = resources.files("rankpack.backend") / "rank_launcher.sh"
        untrusted.write_file(d / RANK_LAUNCHER, source.read_bytes())
        untrusted.write_file(d / "rsh-agent", rsh.agent_script(sys.executable).encode(), 0o755)
        sim.exit_file.unlink(missing_ok=True)
        if sim.spec.shim is not None:
            env = shim_env(builders.LIVE_DIR, sim.spec.shim.wait_mode,
                           flavour=sim.spec.shim.flavour)  # fmt: skip
            lib = Path(env["LD_PRELOAD"].split(":")[0])
            untrusted.write_file(untrusted.own_dir(d / "lib") / lib.name, lib.read_bytes(), 0o755)
            prepare_final_dir(sim.spec.case_dir, sim.n)
    except OSError as exc:
        raise LaunchFailed(f"cannot write to the case volume {d}: {exc}") from exc


def rank_command(sim: SimRecord) -> tuple[str, ...]:
    """Each rank's argv: the rank launcher (``rank_launcher.sh`` on the case volume: it
    writes the rank's pid where its node finds it and starts the solver at its nice value
    within its group pod), then the solver's."""
    return ("/bin/sh", str(rank_dir(sim.spec.case_dir) / RANK_LAUNCHER), *sim.spec.command)


def _rank_env(sim: SimRecord) -> dict[str, str]:
    env = dict(sim.spec.env)
    env["RANKPACK_PID_DIR"] = str(builders.LIVE_DIR)
    nices = group_nices(sim.groups, sim.desired)
    env["RANKPACK_RANK_NICE"] = ",".join(str(nices[r]) for r in range(sim.n))
    shim = sim.spec.shim
    if shim is not None:
        # the live records in each rank pod's own volume (`builders.LIVE_VOLUME`), not the
        # case volume; the final records on the case volume, which the operator mounts too
        env.update(shim_env(builders.LIVE_DIR, shim.wait_mode, flavour=shim.flavour,
                            final_dir=final_dir(sim.spec.case_dir)))  # fmt: skip
        lib = Path(env["LD_PRELOAD"].split(":")[0]).name
        env["LD_PRELOAD"] = str(rank_dir(sim.spec.case_dir) / "lib" / lib)
    return env


class MpirunHost:
    """Starts and follows each simulation's mpirun on this host."""

    def __init__(
        self,
        api: KubeApi,
        config: KubernetesConfig,
        *,
        mpirun: str | None,
        starter: Starter | None,
        lock: threading.RLock,
        notify: Callable[[], None],
    ) -> None:
        self.api, self.config, self.mpirun = api, config, mpirun
        self.starter: Starter = starter if starter is not None else _popen(None, None)
        self.default_starter = starter is None
        self.lock, self.notify = lock, notify

    def start(self, sim: SimRecord) -> None:
        """All rank pods run: start the ranks in them (called by the poller)."""
        life = sim.life
        flavour = sim.spec.mpi
        try:
            mpirunargs.check_mpi(flavour, self.config.mpi_transport)
        except BackendError as exc:
            life.fail(Failure(FailureCode.LAUNCH_FAILED, str(exc)))
            return
        d = rank_dir(sim.spec.case_dir)
        pods = sim.group_pods()
        try:
            mpirun = self.mpirun or find_mpirun(flavour)
        except UserError as exc:
            life.fail(Failure(FailureCode.LAUNCH_FAILED, f"cannot start mpirun: {exc}"))
            return
        # this host's mpirun: its options are those of its Open MPI version (a starter given
        # runs no mpirun of this host: tests' fakes are asked no version)
        asked = flavour == "openmpi" and self.default_starter
        major = mpirunargs.openmpi_major(version_of(mpirun)) if asked else None
        args = mpirunargs.MpirunArgs(
            mpirun=mpirun,
            n_ranks=sim.n,
            hostfile=d / "hostfile",
            agent=d / "rsh-agent",
            case_dir=sim.spec.case_dir,
            command=rank_command(sim),
            env=_rank_env(sim),
            subnet=self.config.pod_subnet or subnet_of(pods),
            as_root=os.geteuid() == 0,
            flavour=flavour,
            transport=self.config.mpi_transport,
            local_address=address_towards(pods) if flavour == "mpich" else None,
            openmpi_major=major or 4,  # (4: ORTE's options, also for what says no version)
        )
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        env.update(
            rsh.agent_env(self.config.kubeconfig, self.config.context, self.api.namespace, C)
        )
        env.update(root_env(flavour))
        try:
            fd = exitwrapper.begin(rank_dir(sim.spec.case_dir))
        except OSError as exc:
            why = f"cannot write the launch marker in {d}: {exc}"
            life.fail(Failure(FailureCode.LAUNCH_FAILED, why))
            return
        if fd is None:  # another process launched it and runs it: follow, never start twice
            life.start(adopted=True)
            return
        sim.launch_fd = fd
        try:
            # (a staged case is the user's: its log may be a link put there; never followed)
            sim.log_file = os.fdopen(untrusted.open_append(sim.spec.log_path), "ab")
            starter = self.starter
            if self.default_starter:
                starter = _popen(sim.exit_file if self.config.detach else None, fd)
            sim.process = starter(mpirunargs.mpirun_argv(args), sim.spec.case_dir, env,
                                  sim.log_file)  # fmt: skip
        except (OSError, UserError, BackendError) as exc:
            life.fail(Failure(FailureCode.LAUNCH_FAILED, f"cannot start mpirun: {exc}"))
            return
        exitwrapper.launched(fd, int(getattr(sim.process, "pid", 0) or os.getpid()))
        # mpirun's rsh agent (another process, `rsh`) opens one pods/exec per group pod:
        # counted here, with this process's own requests
        self.api.requests.add("create", "pods/exec", n=len(sim.groups))
        life.start()
        threading.Thread(target=self._watch, args=(sim,), daemon=True).start()

    def _watch(self, sim: SimRecord) -> None:
        assert sim.process is not None
        code = sim.process.wait()
        if not sim.exit_file.exists():  # the detached exit wrapper wrote mpirun's own code
            with contextlib.suppress(OSError):
                exitwrapper.write_exit(sim.exit_file, code)
        with self.lock:
            sim.life.exit_code = code
            sim.life.end()
        self.notify()

    def kill_in_pods(self, sim: SimRecord) -> None:
        """Ranks and orteds that outlive mpirun: kill every process of each rank container
        but its idle pid 1 (``kill -9 -1`` spares pid 1 and the caller)."""
        argv = ["/bin/sh", "-c", "kill -9 -1 2>/dev/null; true"]

        def kill(name: str) -> None:
            with contextlib.suppress(ApiError):
                self.api.exec(name, C, argv, 15.0)

        running = [str(p["metadata"]["name"]) for p in sim.group_pods() if status.running(p, C)]
        threads = [threading.Thread(target=kill, args=(n,), daemon=True) for n in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)


def subnet_of(pods: list[Obj]) -> str | None:
    """The /24 holding every rank pod's IP (Open MPI's TCP interfaces), if there is one."""
    ips = [p.get("status", {}).get("podIP") for p in pods]
    if not ips or not all(ips):
        return None
    net = ipaddress.ip_network(f"{ips[0]}/24", strict=False)
    if all(ipaddress.ip_address(ip) in net for ip in ips):
        return str(net)
    return None


def address_towards(pods: list[Obj]) -> str | None:
    """This host's address on its route to the first rank pod: where MPICH's hydra proxies
    in the rank pods reach mpiexec here (`mpirunargs.MpirunArgs.local_address`). No packet is
    sent (a UDP socket's connect only picks the route); None if there is no route."""
    ips = [p.get("status", {}).get("podIP") for p in pods]
    if not ips or not ips[0]:
        return None
    try:
        family = socket.AF_INET6 if ":" in ips[0] else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((ips[0], 9))
            return str(probe.getsockname()[0])
    except OSError:
        return None


def rank_env(sim: SimRecord) -> dict[str, str]:
    """The ranks' environment (mpirun's ``-x``), for the launcher pod's instructions too
    (pod mode, `podmode`): the same as mpirun on this host gives them."""
    return _rank_env(sim)
