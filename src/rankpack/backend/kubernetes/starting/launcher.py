"""``rankpack-launcher INSTRUCTIONS OUT``: the launcher pod's prepare container.

Pod mode (`KubernetesConfig.launcher` ``pod``, decision 0008): the backend puts the
`instructions.Instructions` and the hostfile in the simulation's owner ConfigMap, mounted
read-only at `keyed.KEY_DIR` in the launcher pod alone (no rank can change them), and creates
the launcher pod (`launcherpods.launcher_pod`): this container, in rankpack's own image under
the launcher's ServiceAccount (`rbac.LAUNCHER_RULES`, its token mounted here alone), and
beside it the launcher container, in the Simulation's image with no token, whose process,
``rankpack-launch`` (``tools/launch``, from the case volume: `tools`), waits until this one
has written ``launch.json`` (both start at once: an init container would add the kubelet's
look at its end, up to 1 s, to every launch). Here:

1. read and check the instructions: anything unexpected is refused, nothing in them is
   handed to a shell, and mpirun's argv is built here (`mpirunargs.mpirun_argv`) with
   ``rankpack-exec`` of the case volume as its rsh agent (a path the rank pods have too:
   Open MPI's orted segfaults where the agent's path does not exist), the pod subnet as Open
   MPI's TCP interfaces (MPICH: hydra's ``mpiexec`` with the same agent, its proxies calling
   back to this pod's IP), TCP only unless the instructions' ``transport`` says ``auto``;
2. unless mpirun already ran to its end (an exit file), wait, bounded by
   ``start_timeout_s``, until every rank pod runs with an IP (a list of the simulation's
   pods after 0.1 s, then 1.5x longer each time up to ``poll_s``; on urllib3 alone,
   `incluster.InClusterPods`: the official client's import is slower than the pods' start);
   a rank pod that failed ends the wait at once;
3. write each rank pod's IP (``hosts.json``, what ``rankpack-exec`` reads) and what
   ``rankpack-launch`` runs (``launch.json``: the mpirun names to look for on the image's
   PATH, its arguments (Open MPI: also those of Open MPI 5, `args_from_major`, which
   ``rankpack-launch`` takes if the image's ``mpirun --version`` says 5 or later), its
   environment, the log and exit file) into ``OUT``, a volume of this pod alone, and exit 0.
   A failure writes its reason to ``OUT/failed`` instead, which ends ``rankpack-launch``.

``rankpack-launch`` then takes the launch marker (a second launcher never starts a second
mpirun), runs mpirun with SIGTERM, SIGINT and SIGHUP passed on, and writes its exit code to
the exit file. A failure before mpirun ran (bad instructions, rank pods that never ran, no
mpirun in the image) is written to the failing container's termination message
(`builders.TERMINATION_LOG`) and it exits with `LAUNCH_ERROR_EXIT`, writing no exit file.
The backend tells the cases apart (`podmode`): an exit file is mpirun's code; else a
termination message is the launcher's failure; else the container's exit code is mpirun's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from rankpack import untrusted
from rankpack.backend.kubernetes.api.incluster import InClusterPods
from rankpack.backend.kubernetes.api.kubeapi import ApiError, Obj
from rankpack.backend.kubernetes.objects import builders, keyed, launcherpods, status
from rankpack.backend.kubernetes.starting import exitwrapper, mpirunargs
from rankpack.backend.kubernetes.starting.hostmpirun import subnet_of
from rankpack.backend.kubernetes.starting.instructions import Instructions, InstructionsError
from rankpack.backend.protocol import BackendError
from rankpack.errors import UserError

LAUNCH_ERROR_EXIT = 2
"""The launcher's exit code when it failed before mpirun ran (with a termination message)."""
LAUNCH_VERSION = 1
"""``launch.json``'s version, the one ``tools/launch`` reads."""
MPIRUN_NAMES = {
    "openmpi": ("mpirun.openmpi", "mpirun"),
    "mpich": ("mpirun.mpich", "mpiexec.hydra", "mpiexec", "mpirun"),
}
"""What ``rankpack-launch`` looks for on the image's PATH, first found first (Debian's
alternatives' names, then an MPI's own)."""


class LaunchError(Exception):
    """The launcher cannot start mpirun (the message says why, naming what)."""


class Stopped(LaunchError):
    """A signal asked the launcher to end before mpirun was started."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum} before mpirun started")
        self.signum = signum


# -- the pure parts --------------------------------------------------------------------------


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


def mpirun_env(instructions: Instructions, hosts: Path) -> dict[str, str]:
    """What ``rankpack-launch`` adds to mpirun's environment (it drops ``LD_PRELOAD``): the
    key file and the rank pods' addresses ``rankpack-exec`` enters them with, and the
    shell Open MPI's launcher writes its daemons' command for (``SHELL``: it reads the
    user's login shell, and an image's numeric user may have none, so that it warns in the
    log, Open MPI 4 and 5 alike). (No root switches: the launcher container runs as no
    root, ``runAsNonRoot``.)"""
    return {
        keyed.KEY_ENV: str(keyed.KEY_DIR / keyed.KEY_ITEM),
        keyed.HOSTS_ENV: str(hosts),
        "SHELL": "/bin/sh",
    }


def args_from_major(args: mpirunargs.MpirunArgs) -> dict[str, list[str]]:
    """``launch.json``'s ``args_from_major``: mpirun's arguments for an Open MPI from each
    major version on whose options differ from ``args``' (Open MPI 3 and 4's), which
    ``rankpack-launch`` takes when the image's ``mpirun --version`` says so."""
    major = mpirunargs.PRRTE_MAJOR
    prrte = replace(args, openmpi_major=major)
    return {str(major): mpirunargs.mpirun_argv(prrte)[1:]}


def write_json(path: Path, data: object) -> None:
    """``data`` as JSON at ``path``, atomically (`untrusted.write_file`: a reader sees none or
    all of it)."""
    untrusted.write_file(path, json.dumps(data, indent=1).encode())


def write_hosts(pods: Sequence[Obj], directory: Path) -> Path:
    """Each rank pod's IP by its name, as ``rankpack-exec`` reads it (`keyed.HOSTS_ENV`)."""
    path = directory / launcherpods.HOSTS_FILE
    write_json(path, {str(p["metadata"]["name"]): str(p["status"]["podIP"]) for p in pods})
    return path


class PodLister(Protocol):
    """What the wait needs of the API (`KubeApi` has it; `incluster.InClusterPods` is it)."""

    def list_pods(self, label_selector: str) -> list[Obj]: ...


FIRST_POLL_S = 0.1
"""The first pause between two lists of the rank pods; each next one is 1.5x longer, up to
the instructions' ``poll_s``: pods that start at once are seen at once (issue 38: the wait
stands between the launch decision and the first iteration), pods that wait long for an
image cost the apiserver a list per ``poll_s``."""


def wait_for_ranks(
    api: PodLister,
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
    pause = min(FIRST_POLL_S, instructions.poll_s)
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
        sleep(min(pause, left))
        pause = min(pause * 1.5, instructions.poll_s)


# -- the prepare container's run -----------------------------------------------------------


@dataclass
class Preparation:
    """One run of the prepare container: wait for the rank pods, write what ``rankpack-launch``
    runs. Its surroundings are given (the API, time, this pod's environment), so tests drive
    it without a cluster."""

    instructions: Instructions
    api: PodLister
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    signum: int | None = None
    """The first stop signal received."""

    def on_signal(self, signum: int, _frame: object = None) -> None:
        """A signal handler: the wait ends at its next look."""
        if self.signum is None:
            self.signum = signum

    def run(self, out: Path) -> dict[str, object]:
        """Write ``hosts.json`` and ``launch.json`` into ``out``; the launch spec written.
        `LaunchError` when the rank pods never ran, `Stopped` at a signal."""
        ins = self.instructions
        ended = exitwrapper.read_exit(ins.exit_path) is not None
        # it ran to its end already: rankpack-launch says how, never runs it twice
        pods = (
            []
            if ended
            else wait_for_ranks(
                self.api, ins, clock=self.clock, sleep=self.sleep, stopping=lambda: self.signum
            )
        )
        own_ip = self.environ.get(builders.POD_IP_ENV)
        names = MPIRUN_NAMES[ins.mpi]
        try:
            hosts = write_hosts(pods, out)
            args = mpirunargs.MpirunArgs(
                mpirun=names[0],
                n_ranks=ins.n_ranks,
                hostfile=ins.hostfile,
                agent=keyed.tool(ins.case_dir, keyed.AGENT),
                case_dir=ins.case_dir,
                command=ins.command,
                env=ins.env,
                subnet=choose_subnet(ins, pods, own_ip),
                as_root=False,  # (the launcher container runs as no root: runAsNonRoot)
                flavour=ins.mpi,
                transport=ins.transport,
                # hydra's proxies connect back here (pod names do not resolve: no DNS)
                local_address=own_ip or None,
            )  # fmt: skip
            spec: dict[str, object] = {
                "version": LAUNCH_VERSION,
                "mpirun": list(names),
                "args": mpirunargs.mpirun_argv(args)[1:],
                "cwd": str(ins.case_dir),
                "env": mpirun_env(ins, hosts),
                "log": str(ins.log_path),
                "exit": str(ins.exit_path),
                "termination_log": builders.TERMINATION_LOG,
            }
            if ins.mpi == "openmpi":  # the image's mpirun says which (`mpirun --version`)
                spec["args_from_major"] = args_from_major(args)
            write_json(out / launcherpods.LAUNCH_FILE, spec)
        except (UserError, BackendError) as exc:
            raise LaunchError(str(exc)) from exc
        except OSError as exc:
            raise LaunchError(f"cannot write the launch files into {out}: {exc}") from exc
        return spec


def fail(
    message: str,
    code: int = LAUNCH_ERROR_EXIT,
    log: str = builders.TERMINATION_LOG,
    out: Path | None = None,
) -> int:
    """Say why the launcher failed (stderr, the termination message and, for
    ``rankpack-launch`` waiting beside it, `launcherpods.FAILED_FILE` in ``out``) and return
    ``code``."""
    print(f"rankpack-launcher: {message}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        Path(log).write_text(message[:4000])
    if out is not None:
        with contextlib.suppress(OSError):
            untrusted.write_file(out / launcherpods.FAILED_FILE, message[:4000].encode())
    return code


def main(argv: Sequence[str] | None = None, termination_log: str = builders.TERMINATION_LOG) -> int:
    """The ``rankpack-launcher`` console script (the launcher pod's prepare container)."""

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: rankpack-launcher INSTRUCTIONS.json OUT_DIR", file=sys.stderr)
        return LAUNCH_ERROR_EXIT
    path, out = Path(args[0]), Path(args[1])

    def fail_(message: str, code: int = LAUNCH_ERROR_EXIT) -> int:
        return fail(message, code, termination_log, out)

    try:
        instructions = Instructions.parse(path.read_text())
    except (OSError, UnicodeDecodeError, InstructionsError) as exc:
        return fail_(f"cannot read the instructions {path}: {exc}")
    started = time.monotonic()
    try:  # in-cluster: the pod's ServiceAccount (its token mounted in this container alone)
        api = InClusterPods(instructions.namespace)
    except BackendError as exc:
        return fail_(f"cannot reach the Kubernetes API from the launcher pod: {exc}")
    prep = Preparation(instructions, api)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, prep.on_signal)
    try:
        prep.run(out)
        took = time.monotonic() - started
        print(f"rankpack-launcher: {len(instructions.pods)} rank pod(s) running, launch "
              f"written {took:.2f} s after start", file=sys.stderr)  # fmt: skip
    except Stopped as exc:
        return fail_(str(exc), 128 + exc.signum)
    except LaunchError as exc:
        return fail_(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
