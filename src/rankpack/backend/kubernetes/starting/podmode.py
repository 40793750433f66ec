"""The backend's pod mode: each simulation's mpirun runs in its launcher pod (decision 0008).

`KubernetesBackend` uses this when `KubernetesConfig.launcher` is ``pod``. At launch (and
at an adoption that finds mpirun never started) `options` tells `reconcile.reconcile` how
to build the launcher pod and gives the owner ConfigMap the launcher's instructions
(`instructions.Instructions`) and hostfile, which the launcher pod alone mounts: the run
directory, which the ranks may write, holds none of what the launcher runs or is told.
The poller hands `follow` the launcher pod of every listing: running, with every rank pod
running → the simulation is started; its container terminated → ended with mpirun's code
(`reading`: the exit file, else the container's code), or failed with the launcher's own
reason (its termination message); deleted, evicted or lost with its node → failed,
`FailureCode.LAUNCHER_LOST`, naming the pod. `stop` deletes the launcher pod (SIGTERM
reaches mpirun, which takes its ranks down). Nothing here uses ``pods/exec``: this
process never enters a pod in pod mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import ApiError, KubeApi, Obj
from rankpack.backend.kubernetes.objects import builders, keyed, launcherpods, rbac, status
from rankpack.backend.kubernetes.objects.grouppods import group_hostfile
from rankpack.backend.kubernetes.record import SimRecord
from rankpack.backend.kubernetes.starting import mpirunargs, tools
from rankpack.backend.kubernetes.starting.exitwrapper import read_exit, write_exit
from rankpack.backend.kubernetes.starting.hostmpirun import rank_command, rank_env
from rankpack.backend.kubernetes.starting.instructions import Instructions
from rankpack.backend.protocol import BackendError, LaunchFailed
from rankpack.core.failures import Failure, FailureCode

LC = builders.LAUNCHER_CONTAINER
POLL_S = 1.0
"""The longest pause between two lists of the rank pods while the launcher waits for them
(the first comes after 0.1 s: `launcher.FIRST_POLL_S`)."""


def options(
    sim: SimRecord, config: KubernetesConfig, namespace: str
) -> launcherpods.LauncherOptions:
    """How `reconcile.reconcile` builds this simulation's launcher pod and what its owner
    ConfigMap gives it (instructions and hostfile: nothing a rank can change)."""
    spec = sim.spec
    return launcherpods.LauncherOptions(
        instructions(sim, config, namespace).to_json(),
        group_hostfile(spec.sim_id, sim.groups, spec.mpi),
        rbac.LAUNCHER_SERVICE_ACCOUNT,
        config.launcher_env,
        config.launcher_cpu_millis,
        # its rank pods' identity: deploy/ installs it beside the launcher's (no rights)
        rank_service_account=rbac.RANK_SERVICE_ACCOUNT,
        bounds=config.pod_bounds,
        tools_image=config.image,
    )


def options_of(
    sim: SimRecord, config: KubernetesConfig, namespace: str
) -> launcherpods.LauncherOptions | None:
    """`options` for a pod-mode simulation (its launcher's CPU within the namespace's
    LimitRange, `SimRecord.launcher_millis`), None for one whose mpirun runs on this host."""
    if not sim.in_pod:
        return None
    found = options(sim, config, namespace)
    return found if sim.launcher_millis is None else replace(found, cpu_millis=sim.launcher_millis)


def instructions(sim: SimRecord, config: KubernetesConfig, namespace: str) -> Instructions:
    spec = sim.spec
    return Instructions(
        sim_id=spec.sim_id,
        namespace=namespace,
        container=builders.CONTAINER,
        pods=tuple(g.pod_name(spec.sim_id) for g in sim.groups),
        hostfile=keyed.KEY_DIR / keyed.HOSTFILE_ITEM,
        case_dir=spec.case_dir,
        command=rank_command(sim),
        env=rank_env(sim),
        log_path=spec.log_path,
        exit_path=sim.exit_file,
        start_timeout_s=config.start_timeout_s,
        poll_s=POLL_S,
        subnet=config.pod_subnet,
        mpi=spec.mpi,
        transport=config.mpi_transport,
        ranks=sim.n,
    )


def prepare(sim: SimRecord, config: KubernetesConfig) -> None:
    """`LaunchFailed` unless the launcher can run this simulation's MPI; ``rankpack-tools``
    on the case volume (`tools.install`: the rank pods' process, the launcher's last step and
    its rsh agent). Its instructions go in the owner ConfigMap (`options`); the rank launcher
    and the shim's copy are on the case volume too (`hostmpirun.prepare_files`)."""
    try:
        mpirunargs.check_mpi(sim.spec.mpi, config.mpi_transport)
    except BackendError as exc:
        raise LaunchFailed(str(exc)) from exc
    try:
        tools.install(sim.spec.case_dir)
    except OSError as exc:
        raise LaunchFailed(f"cannot write rankpack-tools to the case volume: {exc}") from exc


# -- reading the launcher pod ------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """Where a launcher pod stands: pending (``reason``), running, ended (mpirun's
    ``exit_code``; None: unknown) or failed (``failure``)."""

    state: str
    reason: str = ""
    exit_code: int | None = None
    failure: Failure | None = None


def reading(name: str, pod: Obj | None, exit_code: Callable[[], int | None]) -> Reading:
    """Where the launcher pod ``name`` stands, from the pod as listed (None: it does not
    exist) and mpirun's exit file (read when the pod says it may have ended, or while its
    launcher container runs: the launcher writes it as mpirun ends, before the kubelet's
    next look at the pod shows that)."""
    lost = _lost(name, pod)
    if lost is not None:
        code = exit_code()
        if code == 0 or (pod is None and code is not None):
            return Reading("ended", exit_code=code)  # it ended, then went
        return Reading("failed", failure=lost)
    assert pod is not None
    prepare = launcherpods.PREPARE_CONTAINER
    init = (  # (an init container in pods an older operator made, adopted)
        status.container_status(pod, prepare)
        or status.container_status(pod, prepare, init=True)
        or {}
    )
    init_state = init.get("state") or {}
    init_ended = init_state.get("terminated")
    if init_ended is not None and init_ended.get("exitCode") != 0:  # it waited for the ranks
        return _terminated(name, init_ended, exit_code, init=True)
    cannot = _cannot_start(name, init_state)
    if cannot is not None:
        return cannot
    cs = status.container_status(pod, LC) or {}
    preparing = bool(init_state) and init_ended is None
    state = cs.get("state") or {}
    terminated = state.get("terminated")
    if terminated is not None:
        return _terminated(name, terminated, exit_code, init=False)
    cannot = _cannot_start(name, state)
    if cannot is not None:
        return cannot
    if preparing:  # (rankpack-launch waits for it: mpirun has not started)
        return Reading("pending", reason="its prepare container waits for the rank pods")
    if status.running(pod, LC):
        code = exit_code()
        return Reading("running") if code is None else Reading("ended", exit_code=code)
    return Reading("pending", reason=status.pending_reason(pod))


def _terminated(
    name: str, terminated: Obj, exit_code: Callable[[], int | None], *, init: bool
) -> Reading:
    """A terminated container of the launcher pod ``name`` (``init``: its prepare container,
    else the one that ran ``rankpack-launch``): ended with mpirun's code, or failed."""
    what = "its prepare container" if init else "mpirun"
    code = exit_code()
    if code is not None:
        return Reading("ended", exit_code=code)
    if terminated.get("reason") == status.CONTAINER_LOST:  # its node stopped, came back
        why = f"launcher pod {name} was lost with its node ({terminated.get('message', '')})"
        return Reading("failed", failure=Failure(FailureCode.NODE_LOST, why))
    message = str(terminated.get("message") or "").strip()
    if message:  # it failed before mpirun ran (`launcher.fail`, tools/launch)
        why = f"launcher pod {name}: {message}"
        return Reading("failed", failure=Failure(FailureCode.LAUNCH_FAILED, why))
    if terminated.get("reason") == "OOMKilled":
        why = f"launcher pod {name} was OOM-killed ({what} with it)"
        return Reading("failed", failure=Failure(FailureCode.OOM_KILLED, why))
    container_code = terminated.get("exitCode")
    if init:
        why = f"launcher pod {name}: {what} exited {container_code} before mpirun ran"
        return Reading("failed", failure=Failure(FailureCode.LAUNCH_FAILED, why))
    return Reading("ended", exit_code=int(container_code) if container_code is not None
                   else None)  # fmt: skip


def _cannot_start(name: str, state: Obj) -> Reading | None:
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in status.CANNOT_START_REASONS:
        why = f"launcher pod {name} cannot start: {waiting['reason']}: {waiting.get('message', '')}"
        return Reading("failed", failure=Failure(FailureCode.CANNOT_START, why.strip()))
    return None


def _lost(name: str, pod: Obj | None) -> Failure | None:
    """Why the launcher pod is gone or going without having run to its end (None if not)."""
    code = FailureCode.LAUNCHER_LOST
    lost_node = FailureCode.NODE_LOST  # (not the launcher's own fault: its node's)
    if pod is None:
        return Failure(code, f"launcher pod {name} was deleted (mpirun with it)")
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            why = str(cond.get("reason") or "DisruptionTarget")
            message = str(cond.get("message") or "")
            detail = f"{why}: {message}" if message else why
            node_gone = why in status.NODE_GONE_REASONS
            return Failure(lost_node if node_gone else code,
                           f"launcher pod {name} was evicted ({detail})")  # fmt: skip
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return Failure(code, f"launcher pod {name} was deleted (mpirun with it)")
    st = pod.get("status", {})
    if st.get("phase") == "Failed" and st.get("reason"):  # Evicted, NodeLost, Shutdown, ...
        message = st.get("message") or ""
        text = f"launcher pod {name} {str(st['reason']).lower()}"
        text += f": {message}" if message else ""
        return Failure(lost_node if st["reason"] == "NodeLost" else code, text)
    return None


# -- following it (the poller, under the backend's lock) --------------------------------------


def follow(sim: SimRecord, pod: Obj | None, ranks_running: bool, *, caught_up: bool = True) -> bool:
    """Act on the launcher pod as the cache holds it now (None: not in it); True if
    something changed. A pod missing from a cache that has not taken in its create yet
    (``caught_up`` False) is not missing; once it has, only a second miss counts."""
    life = sim.life
    name = builders.launcher_pod_name(sim.spec.sim_id)
    news = False
    if pod is None:
        if life.ended or sim.reconcile_error is not None or not caught_up:
            return False  # over, not created yet (the poller creates it), or not seen yet
        if not sim.launcher_seen:
            sim.launcher_missing += 1
            if sim.launcher_missing < 2:
                return False
        sim.launcher = None
    else:
        old = sim.launcher
        news = old is None or _version(old) != _version(pod)
        sim.launcher, sim.launcher_seen, sim.launcher_missing = pod, True, 0
        if life.ended:
            return news
    now = reading(name, pod, lambda: read_exit(sim.exit_file))
    if now.state == "failed":
        assert now.failure is not None
        life.fail(now.failure)
        return True
    if now.state == "ended":
        if not sim.exit_file.exists() and now.exit_code is not None:
            with contextlib.suppress(OSError):  # for `list` and a later adopter
                write_exit(sim.exit_file, now.exit_code)
        life.start()
        life.end(now.exit_code)
        return True
    if now.state == "running" and ranks_running and not life.started:
        life.start()  # mpirun starts now (the launcher saw the same pods run)
        return True
    return news


def pending_reason(sim: SimRecord, ranks_reason: str) -> str:
    """A pending simulation's reason with its launcher pod's, if that is not running."""
    pod = sim.launcher
    name = builders.launcher_pod_name(sim.spec.sim_id)
    if pod is not None and status.running(pod, LC):
        now = reading(name, pod, lambda: None)
        if now.state != "pending":
            return ranks_reason
        mine = f"launcher pod {name}: {now.reason}"
    else:
        mine = f"launcher pod {name}: {status.pending_reason(pod)}"
    return f"{ranks_reason}; {mine}" if ranks_reason else mine


def adopted(sim: SimRecord, pod: Obj) -> None:
    """An adopted simulation whose launcher pod was listed: followed through it (whatever
    the launch marker says: its lock may not be visible from here)."""
    sim.in_pod = True
    sim.launcher, sim.launcher_seen = pod, True


def lost_on_adoption(sim: SimRecord) -> Failure:
    """An adopted simulation whose mpirun was started, without a launcher pod or an exit
    code: nothing runs it any more."""
    name = builders.launcher_pod_name(sim.spec.sim_id)
    why = f"launcher pod {name} is gone and mpirun's exit code was never written"
    return Failure(FailureCode.LAUNCHER_LOST, why)


def stop(api: KubeApi, sim: SimRecord) -> None:
    """Delete the launcher pod (its grace period, `launcherpods.LAUNCHER_GRACE_S`: SIGTERM
    reaches mpirun, which takes its ranks down); best effort: the owner's deletion at
    release removes it anyway."""
    with contextlib.suppress(ApiError):
        api.delete("pods", builders.launcher_pod_name(sim.spec.sim_id))


def end_on_failure(api: KubeApi, sim: SimRecord) -> None:
    """The simulation failed: its mpirun must not start, or go on, in the launcher pod
    (`stop`); a launcher pod that has ended is left for people to read (its termination
    message) until release."""
    cs = status.container_status(sim.launcher or {}, LC) or {}
    if "terminated" not in (cs.get("state") or {}):
        stop(api, sim)


def _version(obj: Obj) -> object:
    return obj.get("metadata", {}).get("resourceVersion")
