"""``rankpack-launcher INSTRUCTIONS``: a simulation's mpirun, inside its launcher pod.

Pod mode (`KubernetesConfig.launcher` ``pod``, decision 0008): the backend puts the
`instructions.Instructions` and the hostfile in the simulation's owner ConfigMap, mounted
read-only at `keyed.KEY_DIR` in this pod alone (no rank can change them), and creates the
launcher pod (`builders.launcher_pod`), whose only command is this, with the instructions'
path as its one argument. Here, in the pod, under its ServiceAccount (`rbac.LAUNCHER_RULES`):

1. read and check the instructions: anything unexpected is refused, nothing in them is
   handed to a shell, and mpirun's argv is built here (`mpirunargs.mpirun_argv`), with this
   image's mpirun and ``rankpack-exec``;
2. wait, bounded by ``start_timeout_s``, until every rank pod runs with an IP (one list of
   the simulation's pods every ``poll_s``); a rank pod that failed ends the wait at once;
3. take the launch marker (`exitwrapper.begin`, on the case volume): a second launcher never
   starts a second mpirun;
4. run mpirun with ``rankpack-exec`` as its rsh agent (this image's absolute path, which
   exists in the rank pods too: they run the same image, and Open MPI's orted segfaults
   where the agent's path does not exist), the pod subnet as Open MPI's TCP interfaces
   (MPICH: hydra's ``mpiexec`` with the same agent, its proxies calling back to this pod's
   IP: the instructions' ``mpi``), TCP only unless the instructions' ``transport`` says
   ``auto``,
   the solver output appended to the log; SIGTERM, SIGINT and SIGHUP go on to mpirun, which
   takes its ranks down;
5. write mpirun's exit code to the exit file (atomically) and exit with it (a signal death
   as 128+N).

A failure before mpirun ran (bad instructions, rank pods that never ran, no mpirun) is
written to the container's termination message (`builders.TERMINATION_LOG`) and the
launcher exits with `LAUNCH_ERROR_EXIT`, writing no exit file. The backend tells the cases
apart (`podmode`): an exit file is mpirun's code; else a termination message is the
launcher's failure; else the container's exit code is mpirun's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from rankpack import untrusted
from rankpack.backend.kubernetes.api.kubeapi import ApiError, KubeApi, Obj
from rankpack.backend.kubernetes.objects import builders, status
from rankpack.backend.kubernetes.starting import exitwrapper, mpirunargs, rsh
from rankpack.backend.kubernetes.starting.hostmpirun import subnet_of
from rankpack.backend.kubernetes.starting.instructions import Instructions, InstructionsError
from rankpack.backend.mpirun import find_mpirun, root_env
from rankpack.backend.protocol import BackendError
from rankpack.errors import UserError

LAUNCH_ERROR_EXIT = 2
"""The launcher's exit code when it failed before mpirun ran (with a termination message)."""
AGENT = "rankpack-exec"
MARKER_TRIES = 3


class LaunchError(Exception):
    """The launcher cannot start mpirun (the message says why, naming what)."""


class Stopped(LaunchError):
    """A signal asked the launcher to end before mpirun was started."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum} before mpirun started")
        self.signum = signum


# -- the pure parts --------------------------------------------------------------------------


def exit_status(returncode: int) -> int:
    """The launcher's exit code for mpirun's return code as `subprocess` gives it: the code
    itself, a death by signal N (negative) as 128+N, as a shell would."""
    if returncode < 0:
        return min(128 - returncode, 255)
    return min(returncode, 255)


def choose_subnet(
    instructions: Instructions, pods: Sequence[Obj], own_ip: str | None
) -> str | None:
    """Open MPI's TCP interfaces: the instructions' subnet, else the /24 holding the rank
    pods' IPs and this pod's (mpirun listens here); None (Open MPI picks) if there is none,
    or this pod's IP is unknown."""
    if instructions.subnet:
        return instructions.subnet
    if not own_ip:
        return None
    return subnet_of([*pods, {"status": {"podIP": own_ip}}])


def mpirun_env(
    environ: Mapping[str, str], instructions: Instructions, hosts: Path | None = None
) -> dict[str, str]:
    """mpirun's own environment: this pod's (the in-cluster API address; the key file the
    rsh agent enters the rank pods with), no preload, the rsh agent's connection (in-cluster:
    no kubeconfig; ``hosts``: each rank pod's IP) and Open MPI's root switches."""
    env = {k: v for k, v in environ.items() if k != "LD_PRELOAD"}
    env.update(rsh.agent_env(None, None, instructions.namespace, instructions.container))
    if hosts is not None:
        env[rsh.ENV_HOSTS] = str(hosts)
    env.update(root_env(instructions.mpi))
    return env


def write_hosts(pods: Sequence[Obj], directory: Path) -> Path:
    """Each rank pod's IP by its name, as the rsh agent reads it (`rsh.ENV_HOSTS`)."""
    hosts = {str(p["metadata"]["name"]): str(p["status"]["podIP"]) for p in pods}
    fd, name = tempfile.mkstemp(prefix="rankpack-hosts-", suffix=".json", dir=directory)
    with os.fdopen(fd, "w") as out:
        json.dump(hosts, out)
    return Path(name)


def find_agent(executable: str = sys.executable) -> Path:
    """``rankpack-exec`` of this installation: beside this Python (``/opt/rankpack/bin`` in
    the image), else on PATH; an absolute path without whitespace."""
    beside = Path(executable).parent / AGENT
    found = str(beside) if beside.is_file() else shutil.which(AGENT)
    if not found:
        raise LaunchError(f"no {AGENT} beside {executable} or on PATH")
    return Path(found).absolute()


def wait_for_ranks(
    api: KubeApi,
    instructions: Instructions,
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    stopping: Callable[[], int | None] = lambda: None,
) -> list[Obj]:
    """The rank pods, in rank order, once every one runs with an IP. `LaunchError` when
    one failed, when they do not all run within ``start_timeout_s``, or when the API
    refuses (a missing Role); `Stopped` when a signal arrived meanwhile. An API that does
    not answer is asked again until the deadline."""
    deadline = clock() + instructions.start_timeout_s
    c = instructions.container
    while True:
        signum = stopping()
        if signum is not None:
            raise Stopped(signum)
        try:
            listed = api.list_pods(builders.sim_selector(instructions.sim_id))
        except ApiError as exc:
            if not exc.transient:
                raise LaunchError(
                    f"cannot list the rank pods in {instructions.namespace} (the launcher's "
                    f"ServiceAccount needs pods get/list there): {exc}"
                ) from exc
            waiting = [f"the API does not answer: {exc}"]
        else:
            by_name = {str(p.get("metadata", {}).get("name")): p for p in listed}
            waiting = []
            for name in instructions.pods:
                pod = by_name.get(name)
                if pod is None:
                    waiting.append(f"{name}: not created yet")
                    continue
                failed = status.failure(pod, c)
                if failed is not None:
                    raise LaunchError(failed.message)
                if not status.running(pod, c) or not pod.get("status", {}).get("podIP"):
                    waiting.append(f"{name}: {status.pending_reason(pod)}")
            if not waiting:
                return [by_name[n] for n in instructions.pods]
        left = deadline - clock()
        if left <= 0:
            raise LaunchError(
                f"rank pods not running after {instructions.start_timeout_s:.0f} s: "
                + "; ".join(waiting)
            )
        sleep(min(instructions.poll_s, left))


# -- one run -----------------------------------------------------------------------------------


class Child(Protocol):
    """mpirun as started (a `subprocess.Popen`, or a test's fake)."""

    @property
    def pid(self) -> int: ...

    def wait(self) -> int: ...
    def send_signal(self, sig: int) -> None: ...


Spawn = Callable[[list[str], Path, dict[str, str], IO[bytes], tuple[int, ...]], Child]


def _popen(
    argv: list[str], cwd: Path, env: dict[str, str], log: IO[bytes], fds: tuple[int, ...]
) -> Child:
    return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, pass_fds=fds)  # fmt: skip


@dataclass
class LauncherRun:
    """One run of the launcher: wait for the rank pods, start mpirun once, follow it. Its
    surroundings are given (the API, time, how a process is started, this pod's
    environment), so tests drive it without a cluster or processes."""

    instructions: Instructions
    api: KubeApi
    spawn: Spawn = _popen
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    mpirun: str | None = None
    """mpirun's path; None: this image's (`find_mpirun`)."""
    agent: Path | None = None
    """The rsh agent's path; None: this image's ``rankpack-exec`` (`find_agent`)."""
    as_root: bool = field(default_factory=lambda: os.geteuid() == 0)
    signum: int | None = None
    """The first stop signal received."""
    child: Child | None = None

    def on_signal(self, signum: int, _frame: object = None) -> None:
        """A signal handler: passed on to mpirun, or remembered until it is started."""
        if self.signum is None:
            self.signum = signum
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signum)

    def _take_marker(self, marker: Path) -> tuple[str, int | None]:
        """The marker's state and, if mpirun never started, its locked descriptor. A
        process that only looks (`exitwrapper.state`, an adopting backend) holds the lock for
        an instant: asked again a few times before it counts as taken."""
        for _ in range(MARKER_TRIES):
            state = exitwrapper.state(marker)
            if state != "never":
                return state, None
            fd = exitwrapper.begin(marker)
            if fd is not None:
                return state, fd
            self.sleep(0.1)
        return "running", None

    def run(self) -> int:
        """mpirun's exit status (`exit_status`); `LaunchError` if it was never started."""
        ins = self.instructions
        earlier = exitwrapper.read_exit(ins.exit_path)
        if earlier is not None:  # it ran to its end already: never run it twice
            return exit_status(earlier)
        pods = wait_for_ranks(self.api, ins, clock=self.clock, sleep=self.sleep,
                              stopping=lambda: self.signum)  # fmt: skip
        try:
            hosts = write_hosts(pods, Path(tempfile.gettempdir()))
        except OSError as exc:
            raise LaunchError(f"cannot write the rank pods' addresses: {exc}") from exc
        own_ip = self.environ.get(builders.POD_IP_ENV)
        try:
            args = mpirunargs.MpirunArgs(
                mpirun=self.mpirun or find_mpirun(ins.mpi),
                n_ranks=ins.n_ranks,
                hostfile=ins.hostfile,
                agent=self.agent or find_agent(),
                case_dir=ins.case_dir,
                command=ins.command,
                env=ins.env,
                subnet=choose_subnet(ins, pods, own_ip),
                as_root=self.as_root,
                flavour=ins.mpi,
                transport=ins.transport,
                # hydra's proxies connect back here (pod names do not resolve: no DNS)
                local_address=own_ip or None,
            )
            argv = mpirunargs.mpirun_argv(args)
        except (UserError, BackendError) as exc:
            raise LaunchError(str(exc)) from exc
        marker = ins.exit_path.parent
        try:
            state, fd = self._take_marker(marker)
        except OSError as exc:
            raise LaunchError(f"cannot take the launch marker in {marker}: {exc}") from exc
        if fd is None:
            raise LaunchError(
                f"mpirun of {ins.sim_id} was launched already (the marker in {marker} says "
                f"{state}): not starting a second one"
            )
        try:
            with os.fdopen(untrusted.open_append(ins.log_path), "ab") as log:
                if self.signum is not None:
                    raise Stopped(self.signum)
                env = mpirun_env(self.environ, ins, hosts)
                self.child = self.spawn(argv, ins.case_dir, env, log, (fd,))
                with contextlib.suppress(OSError):
                    exitwrapper.launched(fd, self.child.pid)
                if self.signum is not None:  # it arrived while mpirun was being started
                    self.child.send_signal(self.signum)
                code = self.child.wait()
        except OSError as exc:
            raise LaunchError(f"cannot start mpirun: {exc}") from exc
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):  # the container's exit code carries it too
            exitwrapper.write_exit(ins.exit_path, code)
        return exit_status(code)


def fail(message: str, code: int = LAUNCH_ERROR_EXIT, log: str = builders.TERMINATION_LOG) -> int:
    """Say why the launcher failed (stderr, the termination message) and return ``code``."""
    print(f"rankpack-launcher: {message}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        Path(log).write_text(message[:4000])
    return code


def main(argv: Sequence[str] | None = None, termination_log: str = builders.TERMINATION_LOG) -> int:
    """The ``rankpack-launcher`` console script (the launcher pod's command)."""

    def fail_(message: str, code: int = LAUNCH_ERROR_EXIT) -> int:
        return fail(message, code, termination_log)

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: rankpack-launcher INSTRUCTIONS.json", file=sys.stderr)
        return LAUNCH_ERROR_EXIT
    path = Path(args[0])
    try:
        instructions = Instructions.parse(path.read_text())
    except (OSError, UnicodeDecodeError, InstructionsError) as exc:
        return fail_(f"cannot read the instructions {path}: {exc}")
    from rankpack.backend.kubernetes.api.client import ClientKubeApi
    from rankpack.backend.kubernetes.api.config import KubernetesConfig

    try:  # in-cluster: the pod's ServiceAccount
        api = ClientKubeApi(KubernetesConfig(kubeconfig=None, namespace=instructions.namespace))
    except BackendError as exc:
        return fail_(f"cannot reach the Kubernetes API from the launcher pod: {exc}")
    launch = LauncherRun(instructions, api)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, launch.on_signal)
    try:
        return launch.run()
    except Stopped as exc:
        return fail_(str(exc), 128 + exc.signum)
    except LaunchError as exc:
        return fail_(str(exc))


if __name__ == "__main__":
    sys.exit(main())
