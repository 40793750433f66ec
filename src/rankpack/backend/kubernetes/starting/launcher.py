"""``rankpack-launcher INSTRUCTIONS``: a simulation's mpirun, inside its launcher pod.

Pod mode (`KubernetesConfig.launcher` ``pod``, decision 0008): the backend writes the
`Instructions` to ``<case>/.rankpack/launch.json`` on the case volume and creates the
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
import ipaddress
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from rankpack.backend.kubernetes.api.config import MPI_TRANSPORTS
from rankpack.backend.kubernetes.api.kubeapi import ApiError, KubeApi, Obj
from rankpack.backend.kubernetes.objects import builders, status
from rankpack.backend.kubernetes.starting import exitwrapper, mpirunargs, rsh
from rankpack.backend.kubernetes.starting.hostmpirun import subnet_of
from rankpack.backend.mpirun import find_mpirun, root_env
from rankpack.backend.protocol import BackendError
from rankpack.errors import UserError

VERSION = 1
LAUNCH_ERROR_EXIT = 2
"""The launcher's exit code when it failed before mpirun ran (with a termination message)."""
AGENT = "rankpack-exec"
MARKER_TRIES = 3
MAX_TIMEOUT_S = 7 * 24 * 3600.0
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class InstructionsError(ValueError):
    """The instructions file is not what the backend writes: refused, nothing is run."""


class LaunchError(Exception):
    """The launcher cannot start mpirun (the message says why, naming what)."""


class Stopped(LaunchError):
    """A signal asked the launcher to end before mpirun was started."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum} before mpirun started")
        self.signum = signum


@dataclass(frozen=True)
class Instructions:
    """What the backend tells a launcher pod (``launch.json``; `to_json` and `parse`)."""

    sim_id: str
    namespace: str
    """Where the rank pods are (the launcher's ServiceAccount's namespace)."""
    container: str
    """The rank pods' container the ranks start in."""
    pods: tuple[str, ...]
    """The rank pods, in rank order (the hostfile's order)."""
    hostfile: Path
    case_dir: Path
    """mpirun's working directory (``--wdir`` of the ranks)."""
    command: tuple[str, ...]
    """The solver's argv (each rank's)."""
    env: Mapping[str, str]
    """The ranks' environment (``-x NAME=VALUE``), not mpirun's."""
    log_path: Path
    """mpirun's stdout and stderr are appended here (rank 0's solver log)."""
    exit_path: Path
    """mpirun's exit code is written here; its directory holds the launch marker."""
    start_timeout_s: float
    """How long to wait for the rank pods to run."""
    poll_s: float = 1.0
    """How often the rank pods are listed while waiting."""
    subnet: str | None = None
    """Open MPI's TCP interfaces (a CIDR); None: the /24 holding every pod's IP, if any."""
    mpi: str = "openmpi"
    """The MPI library (`mpirunargs.FLAVOURS`): Open MPI's mpirun or MPICH's hydra."""
    transport: str = "tcp"
    """`config.MPI_TRANSPORTS`: TCP only (the default), or the library's choice."""

    def to_json(self) -> str:
        data = {
            "version": VERSION,
            "sim_id": self.sim_id,
            "namespace": self.namespace,
            "container": self.container,
            "pods": list(self.pods),
            "hostfile": str(self.hostfile),
            "case_dir": str(self.case_dir),
            "command": list(self.command),
            "env": dict(self.env),
            "log_path": str(self.log_path),
            "exit_path": str(self.exit_path),
            "start_timeout_s": self.start_timeout_s,
            "poll_s": self.poll_s,
            "subnet": self.subnet,
            "mpi": self.mpi,
            "transport": self.transport,
        }
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def parse(cls, text: str) -> Instructions:
        """The instructions in ``text``; `InstructionsError` for anything else (unknown or
        missing keys, wrong types, relative paths, names that are not DNS labels)."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InstructionsError(f"not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise InstructionsError("not a JSON object")
        missing = sorted(_KEYS - _OPTIONAL - set(data))
        unknown = sorted(set(data) - _KEYS)
        if missing or unknown:
            raise InstructionsError(f"missing keys {missing}, unknown keys {unknown}")
        if data["version"] != VERSION:
            raise InstructionsError(f"version {data['version']!r}; this launcher reads {VERSION}")
        pods = _strings(data, "pods")
        if not pods or len(set(pods)) != len(pods):
            raise InstructionsError("pods: one or more distinct pod names")
        for name in (*pods, _string(data, "namespace"), _string(data, "container")):
            _check_label(name)
        sim_id = _string(data, "sim_id")
        try:
            builders.check_sim_id(sim_id, len(pods))
        except BackendError as exc:
            raise InstructionsError(str(exc)) from exc
        command = _strings(data, "command")
        if not command:
            raise InstructionsError("command: empty")
        return cls(
            sim_id=sim_id,
            namespace=_string(data, "namespace"),
            container=_string(data, "container"),
            pods=tuple(pods),
            hostfile=_path(data, "hostfile"),
            case_dir=_path(data, "case_dir"),
            command=tuple(command),
            env=_env(data),
            log_path=_path(data, "log_path"),
            exit_path=_path(data, "exit_path"),
            start_timeout_s=_seconds(data, "start_timeout_s"),
            poll_s=min(_seconds(data, "poll_s"), 60.0),
            subnet=_subnet(data),
            mpi=_choice(data, "mpi", mpirunargs.FLAVOURS),
            transport=_choice(data, "transport", MPI_TRANSPORTS),
        )


_KEYS = frozenset({
    "version", "sim_id", "namespace", "container", "pods", "hostfile", "case_dir", "command",
    "env", "log_path", "exit_path", "start_timeout_s", "poll_s", "subnet", "mpi", "transport",
})  # fmt: skip
"""What `Instructions.to_json` writes and `Instructions.parse` expects: no more, no less."""
_OPTIONAL = frozenset({"mpi", "transport"})
"""Keys a launcher reads as their defaults (Open MPI, TCP) when absent: instructions
written before MPICH was launched on Kubernetes."""


def _choice(data: Mapping[str, Any], key: str, allowed: Sequence[str]) -> str:
    if key not in data:
        return allowed[0]
    value = _string(data, key)
    if value not in allowed:
        raise InstructionsError(f"{key}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _string(data: Mapping[str, Any], key: str) -> str:
    value = data[key]
    if not isinstance(value, str) or not value or "\0" in value:
        raise InstructionsError(f"{key}: not a non-empty string")
    return value


def _check_label(name: str) -> None:
    if not _DNS_LABEL.match(name) or len(name) > 63:
        raise InstructionsError(f"'{name}' is not a DNS label")


def _strings(data: Mapping[str, Any], key: str) -> list[str]:
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(v, str) and "\0" not in v for v in value):
        raise InstructionsError(f"{key}: not a list of strings")
    return list(value)


def _path(data: Mapping[str, Any], key: str) -> Path:
    path = Path(_string(data, key))
    if not path.is_absolute() or ".." in path.parts:
        raise InstructionsError(f"{key}: {path} is not an absolute path without '..'")
    return path


def _env(data: Mapping[str, Any]) -> dict[str, str]:
    value = data["env"]
    if not isinstance(value, dict):
        raise InstructionsError("env: not an object")
    for name, text in value.items():
        if not _ENV_NAME.match(name) or not isinstance(text, str) or "\0" in text:
            raise InstructionsError(f"env: {name!r} is not NAME: string")
    return dict(value)


def _seconds(data: Mapping[str, Any], key: str) -> float:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InstructionsError(f"{key}: not a number")
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise InstructionsError(f"{key}: {value} is not in (0, {MAX_TIMEOUT_S:.0f}] s")
    return float(value)


def _subnet(data: Mapping[str, Any]) -> str | None:
    if data["subnet"] is None:
        return None
    text = _string(data, "subnet")
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError as exc:
        raise InstructionsError(f"subnet: {exc}") from exc


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


def mpirun_env(environ: Mapping[str, str], instructions: Instructions) -> dict[str, str]:
    """mpirun's own environment: this pod's (the in-cluster API address), no preload, the
    rsh agent's connection (in-cluster: no kubeconfig) and Open MPI's root switches."""
    env = {k: v for k, v in environ.items() if k != "LD_PRELOAD"}
    env.update(rsh.agent_env(None, None, instructions.namespace, instructions.container))
    env.update(root_env(instructions.mpi))
    return env


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


def write_exit(path: Path, returncode: int) -> None:
    """mpirun's return code (as `subprocess` gives it, as the host launcher writes it),
    atomically: a reader sees no file or the whole code."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{returncode}\n")
    os.replace(tmp, path)


def read_exit(path: Path) -> int | None:
    """The code in an exit file; None if there is none (or it does not parse)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


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
        earlier = read_exit(ins.exit_path)
        if earlier is not None:  # it ran to its end already: never run it twice
            return exit_status(earlier)
        pods = wait_for_ranks(self.api, ins, clock=self.clock, sleep=self.sleep,
                              stopping=lambda: self.signum)  # fmt: skip
        own_ip = self.environ.get(builders.POD_IP_ENV)
        try:
            args = mpirunargs.MpirunArgs(
                mpirun=self.mpirun or find_mpirun(ins.mpi),
                n_ranks=len(ins.pods),
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
            with open(ins.log_path, "ab") as log:
                if self.signum is not None:
                    raise Stopped(self.signum)
                self.child = self.spawn(argv, ins.case_dir, mpirun_env(self.environ, ins), log,
                                        (fd,))  # fmt: skip
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
            write_exit(ins.exit_path, code)
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
