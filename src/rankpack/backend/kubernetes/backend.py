"""`KubernetesBackend`: backend protocol v2 with one pod per MPI rank, resized in place.

Called by the control loop (`rankpack.controller.loop`) exactly like the local backend.
`launch` creates (get-or-create: idempotent) the simulation's owner ConfigMap, headless
Service and rank pods from the pure builders (`builders`) and returns; a poller thread
lists the pods of all simulations every ``poll_s`` (faster while a resize is in flight),
starts ``mpirun`` on this host once every rank pod of a simulation runs (ranks enter the
pods through the rsh agent, `rsh`), follows resizes from the pods' status (`status`),
and turns a deleted or evicted rank pod into a failed simulation. `wait` wakes on the
poller's and mpirun's news. Counters come from the pods' cgroups on this node (`usage`),
the solver log and the shim's records from the shared case volume.
See ``docs/decisions/0008-kubernetes-launcher.md``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Protocol

from rankpack.backend.kubernetes import builders, launcher, rsh, status, usage
from rankpack.backend.kubernetes.api import KubeApi, KubeError, Obj
from rankpack.backend.kubernetes.config import KubernetesConfig, VolumeSource, parse_volume
from rankpack.backend.protocol import (
    BackendError,
    Inventory,
    LaunchFailed,
    NodeCapacity,
    Quota,
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
from rankpack.profile.records import RecordReader, record_path, set_wait_modes
from rankpack.profile.shim import shim_env

C = builders.CONTAINER


def rank_dir(case_dir: Path) -> Path:
    """The backend's files on the case volume (hostfile, agent, shim copy, exit code)."""
    return case_dir / ".rankpack"


def shim_dir(case_dir: Path) -> Path:
    return rank_dir(case_dir) / "shim"


class Proc(Protocol):
    """The running mpirun (a `subprocess.Popen` in a new session, or a test's fake)."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill_group(self, sig: int) -> None: ...


class _Popen:
    def __init__(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        log: IO[bytes],
        *,
        detach_exit_file: Path | None = None,
        lock_fd: int | None = None,
    ) -> None:
        if detach_exit_file is not None:
            lock = ["--lock-fd", str(lock_fd)] if lock_fd is not None else []
            argv = [sys.executable, "-m", "rankpack.backend.kubernetes.launcher",
                    str(detach_exit_file), *lock, "--", *argv]  # fmt: skip
        self.p = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=None if detach_exit_file is not None else _terminate_with_parent,
            pass_fds=(lock_fd,) if lock_fd is not None else (),
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.p.pid

    @property
    def returncode(self) -> int | None:
        return self.p.returncode

    def poll(self) -> int | None:
        return self.p.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.p.wait(timeout)

    def kill_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, sig)


Starter = Callable[[list[str], Path, dict[str, str], IO[bytes]], Proc]


def _popen(exit_file: Path | None, lock_fd: int | None) -> Starter:
    def start(argv: list[str], cwd: Path, env: dict[str, str], log: IO[bytes]) -> Proc:
        return _Popen(argv, cwd, env, log, detach_exit_file=exit_file, lock_fd=lock_fd)

    return start


@dataclass
class _Resize:
    status: ResizeStatus
    target: RankResources
    generation: int | None


@dataclass
class _Sim:
    spec: SimSpec
    image: str
    volume: VolumeSource
    desired: list[RankResources]
    pods: dict[int, Obj] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)
    resizes: dict[int, _Resize] = field(default_factory=dict)
    process: Proc | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)
    started: bool = False
    """mpirun was started (by this process, or by the one we adopted from)."""
    adopted: bool = False
    exit_code: int | None = None
    ended: bool = False
    failure: str | None = None
    failure_rank: int = 0
    failure_handled: bool = False
    stopped: bool = False
    released: bool = False
    log_offset: int = 0
    readers: list[RecordReader] = field(default_factory=list)
    counters: dict[int, usage.CpuCounters] = field(default_factory=dict)
    created_t: float = field(default_factory=time.monotonic)
    launch_fd: int | None = None
    """The launch marker's locked descriptor while this process holds it (`launcher`)."""
    reconcile_error: str | None = None
    """Creating its objects failed transiently; the poller tries again."""

    @property
    def n(self) -> int:
        return len(self.desired)

    @property
    def exit_file(self) -> Path:
        return rank_dir(self.spec.case_dir) / "mpirun.exit"


class KubernetesBackend:
    """One pod per rank in ``config.namespace``; mpirun on this host (decision 0008)."""

    name = "kubernetes"

    def __init__(
        self,
        api: KubeApi,
        config: KubernetesConfig,
        *,
        usage_source: usage.UsageSource | None = None,
        starter: Starter | None = None,
        mpirun: str | None = None,
        background: bool = True,
    ) -> None:
        self.api = api
        self.config = config
        self.usage = usage_source if usage_source is not None else usage.detect(api, C)
        self.starter: Starter = starter if starter is not None else _Popen
        self.default_starter = starter is None
        self.mpirun = mpirun
        self.background = background
        self._stager = Stager(self._notify)
        self._sims: dict[str, _Sim] = {}
        self._lock = threading.RLock()
        self._news = News()
        self._poller: threading.Thread | None = None
        self._poller_lock = threading.Lock()
        """Guards starting and ending the poller, so work added while it ends is seen."""
        self._closed = threading.Event()
        self.poll_error: str | None = None
        self._nodes_forbidden = False
        self._quotas_forbidden = False
        self._inventory: Inventory | None = None
        """The last inventory read: answered while the apiserver does not answer."""
        self._orphans: set[str] = set()
        """Released simulations whose objects could not be deleted yet (apiserver away)."""

    # -- capacity and facts ------------------------------------------------------------------

    def inventory(self) -> Inventory:
        """Ready, schedulable nodes: allocatable minus the requests of every pod that is not
        terminated (all namespaces if the identity may list them, else this namespace).

        While the apiserver does not answer (unreachable, 5xx), the last inventory read is
        answered: nothing can be launched then anyway (creating pods fails and is retried),
        and the control loop must not stop over it."""
        try:
            found = self._read_inventory()
        except KubeError as exc:
            if exc.transient and self._inventory is not None:
                return self._inventory
            raise
        except BackendError as exc:
            cause = exc.__cause__
            if isinstance(cause, KubeError) and cause.transient and self._inventory is not None:
                return self._inventory
            raise
        self._inventory = found
        return found

    def _quota(self) -> Quota | None:
        """The namespace's tightest CPU-request quota (None: none, or not readable)."""
        if self._quotas_forbidden:
            return None
        try:
            found = self.api.list("resourcequotas", "")
        except KubeError as exc:
            if exc.status != 403:
                raise
            self._quotas_forbidden = True  # no right to read them: learned from refusals
            return None
        quotas = []
        for q in found:
            cpu = status.cpu_quota(q)
            if cpu is not None:
                quotas.append(Quota(str(q["metadata"]["name"]), cpu[0], cpu[1]))
        return min(quotas, key=lambda q: q.hard_millis - q.used_millis, default=None)

    def _read_inventory(self) -> Inventory:
        return replace(self._read_nodes(), quota=self._quota())

    def _read_nodes(self) -> Inventory:
        try:
            if self._nodes_forbidden:
                raise KubeError(403, "Forbidden", "nodes (remembered)")
            nodes = [
                n for n in self.api.list_nodes()
                if status.node_ready(n) and not n.get("spec", {}).get("unschedulable")
            ]  # fmt: skip
        except KubeError as exc:
            self._nodes_forbidden = exc.status == 403
            if exc.status != 403 or self.config.allocatable_millis is None:
                raise BackendError(
                    f"cannot read the cluster's nodes ({exc}); give the CPU the namespace may "
                    "use with --allocatable (e.g. --allocatable 2 on the dev cluster), or "
                    "grant this identity get/list on nodes"
                ) from exc
            ours = self.api.list_pods("")
            total = sum(status.pod_request_millis(p) for p in ours if _live(p))
            return Inventory((NodeCapacity("cluster", self.config.allocatable_millis, total),))
        live = "status.phase!=Succeeded,status.phase!=Failed"
        try:
            pods = self.api.list_pods_all_namespaces(live)
        except KubeError as exc:
            if exc.status != 403:
                raise
            pods = [p for p in self.api.list_pods("") if _live(p)]
        used: dict[str, int] = {}
        ranks: dict[str, int] = {}
        for p in pods:
            node = p.get("spec", {}).get("nodeName")
            if node:
                used[node] = used.get(node, 0) + status.pod_request_millis(p)
                if builders.RANK_LABEL in (p.get("metadata", {}).get("labels") or {}):
                    ranks[node] = ranks.get(node, 0) + 1
        names = [str(n["metadata"]["name"]) for n in nodes]
        return Inventory(
            tuple(
                NodeCapacity(
                    name,
                    status.node_allocatable_millis(n),
                    used.get(name, 0),
                    ranks.get(name, 0),
                )
                for name, n in zip(names, nodes, strict=True)
            )
        )

    def placement(self) -> dict[str, str]:
        return {
            "namespace": self.api.namespace,
            "image": self.config.image,
            "usage": self.usage.name,
            "launcher": "mpirun+pods/exec",
        }

    def clock(self) -> float:
        return time.monotonic()

    # -- events ------------------------------------------------------------------------------

    def _notify(self) -> None:
        self._news.notify()

    def wait(self, timeout_s: float) -> None:
        self._news.wait(timeout_s)

    # -- staging (on the shared volume, in a worker thread, like the local backend) --------

    def stage(self, spec: StageSpec) -> None:
        if spec.sim_id in self._sims:
            raise BackendError(f"simulation {spec.sim_id} exists already")
        self._stager.stage(spec)

    # -- launch ------------------------------------------------------------------------------

    def launch(self, spec: SimSpec) -> None:
        if spec.sim_id in self._sims:
            raise BackendError(f"simulation {spec.sim_id} was launched already")
        builders.check_sim_id(spec.sim_id, len(spec.ranks))
        self._stager.launched(spec.sim_id)
        try:
            volume = parse_volume(spec.volume, spec.case_dir)
        except UserError as exc:
            raise LaunchFailed(str(exc)) from exc
        image = spec.image or self.config.image
        sim = _Sim(spec=spec, image=image, volume=volume, desired=list(spec.ranks))
        self._prepare_files(sim)
        try:
            self.reconcile(spec, image, volume)
        except KubeError as exc:
            if not exc.transient:
                with contextlib.suppress(KubeError):
                    self.api.delete("configmaps", builders.owner_name(spec.sim_id), "Foreground")
                raise LaunchFailed(f"cannot create the rank pods of {spec.sim_id}: {exc}") from exc
            # The apiserver is away: the poller creates what is missing once it answers
            # (get-or-create is idempotent), bounded by start_timeout_s like any start.
            sim.reconcile_error = str(exc)
        self._attach_readers(sim)
        with self._lock:
            self._sims[spec.sim_id] = sim
        self._ensure_poller()

    def reconcile(self, spec: SimSpec, image: str, volume: VolumeSource) -> None:
        """Get-or-create the owner, the Service and every rank pod (idempotent: objects that
        exist and belong to this simulation are left alone; someone else's are an error)."""
        owner_obj = self._get_or_create("configmaps", builders.owner_configmap(spec, image), spec)
        owner = builders.OwnerRef(
            builders.owner_name(spec.sim_id), str(owner_obj["metadata"]["uid"])
        )
        self._get_or_create("services", builders.headless_service(spec, owner), spec)
        for rank in range(len(spec.ranks)):
            self._get_or_create("pods", builders.rank_pod(spec, rank, owner, volume, image), spec)

    def _get_or_create(self, kind: str, body: Obj, spec: SimSpec) -> Obj:
        name = str(body["metadata"]["name"])
        try:
            found = self.api.get(kind, name)
        except KubeError as exc:
            if not exc.not_found:
                raise
        else:
            found_labels = found.get("metadata", {}).get("labels") or {}
            if found_labels.get(builders.SIM_LABEL) != spec.sim_id:
                raise LaunchFailed(f"{kind} {name} exists and does not belong to {spec.sim_id}")
            return found
        try:
            return self.api.create(kind, body)
        except KubeError as exc:
            if exc.conflict:  # created meanwhile (another controller): take it
                return self.api.get(kind, name)
            raise

    def _prepare_files(self, sim: _Sim) -> None:
        """Hostfile, rsh agent and shim library on the case volume (paths the pods share)."""
        d = rank_dir(sim.spec.case_dir)
        try:
            d.mkdir(parents=True, exist_ok=True)
            (d / "hostfile").write_text(builders.hostfile(sim.spec.sim_id, sim.n))
            agent = d / "rsh-agent"
            agent.write_text(rsh.agent_script(sys.executable))
            agent.chmod(0o755)
            sim.exit_file.unlink(missing_ok=True)
            if sim.spec.shim is not None:
                shim_dir(sim.spec.case_dir).mkdir(parents=True, exist_ok=True)
                env = shim_env(shim_dir(sim.spec.case_dir), sim.spec.shim.wait_mode,
                               flavour=sim.spec.shim.flavour)  # fmt: skip
                lib = Path(env["LD_PRELOAD"].split(":")[0])
                (d / "lib").mkdir(exist_ok=True)
                shutil.copy2(lib, d / "lib" / lib.name)
        except OSError as exc:
            raise LaunchFailed(f"cannot write to the case volume {d}: {exc}") from exc

    def _rank_env(self, sim: _Sim) -> dict[str, str]:
        env = dict(sim.spec.env)
        shim = sim.spec.shim
        if shim is not None:
            live = shim_dir(sim.spec.case_dir)
            env.update(shim_env(live, shim.wait_mode, flavour=shim.flavour))
            lib = Path(env["LD_PRELOAD"].split(":")[0]).name
            env["LD_PRELOAD"] = str(rank_dir(sim.spec.case_dir) / "lib" / lib)
        return env

    def _start_mpirun(self, sim: _Sim) -> None:
        """All rank pods run: start the ranks in them (called by the poller)."""
        if sim.spec.mpi != "openmpi":
            sim.failure = f"the Kubernetes backend launches Open MPI only, not {sim.spec.mpi}"
            return
        from rankpack.backend.local import find_mpirun

        d = rank_dir(sim.spec.case_dir)
        args = builders.MpirunArgs(
            mpirun=self.mpirun or find_mpirun("openmpi"),
            n_ranks=sim.n,
            hostfile=d / "hostfile",
            agent=d / "rsh-agent",
            case_dir=sim.spec.case_dir,
            command=sim.spec.command,
            env=self._rank_env(sim),
            subnet=self.config.pod_subnet or _subnet_of(list(sim.pods.values())),
            as_root=os.geteuid() == 0,
        )
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        env.update(
            rsh.agent_env(self.config.kubeconfig, self.config.context, self.api.namespace, C)
        )
        if os.geteuid() == 0:
            env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
            env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        try:
            fd = launcher.begin(rank_dir(sim.spec.case_dir))
        except OSError as exc:
            sim.failure = f"cannot write the launch marker in {d}: {exc}"
            return
        if fd is None:  # another process launched it and runs it: follow, never start twice
            sim.started = sim.adopted = True
            return
        sim.launch_fd = fd
        try:
            sim.log_file = open(sim.spec.log_path, "ab")  # noqa: SIM115 - closed in release()
            starter = self.starter
            if self.default_starter:
                starter = _popen(sim.exit_file if self.config.detach else None, fd)
            sim.process = starter(builders.mpirun_argv(args), sim.spec.case_dir, env,
                                  sim.log_file)  # fmt: skip
        except (OSError, UserError, BackendError) as exc:
            sim.failure = f"cannot start mpirun: {exc}"
            return
        launcher.launched(fd, int(getattr(sim.process, "pid", 0) or os.getpid()))
        sim.started = True
        threading.Thread(target=self._watch_mpirun, args=(sim,), daemon=True).start()

    def _watch_mpirun(self, sim: _Sim) -> None:
        assert sim.process is not None
        code = sim.process.wait()
        if not sim.exit_file.exists():  # a detached launcher wrote mpirun's own code
            with contextlib.suppress(OSError):
                sim.exit_file.write_text(f"{code}\n")
        with self._lock:
            sim.exit_code = code
            sim.ended = True
        self._notify()

    def _attach_readers(self, sim: _Sim) -> None:
        if sim.spec.shim is not None:
            live = shim_dir(sim.spec.case_dir)
            sim.readers = [RecordReader(record_path(live, r)) for r in range(sim.n)]

    # -- the poller: the backend's event source --------------------------------------------

    def _ensure_poller(self) -> None:
        if not self.background:
            return
        with self._poller_lock:
            if self._poller is None or not self._poller.is_alive():
                self._poller = threading.Thread(target=self._poll_loop, daemon=True)
                self._poller.start()

    def _has_work(self) -> bool:
        with self._lock:
            return bool(self._orphans) or any(not s.released for s in self._sims.values())

    def _poll_loop(self) -> None:
        while not self._closed.is_set():
            busy = self.poll_once()
            if not busy:
                with self._poller_lock:  # ends only if nothing arrived meanwhile
                    if not self._has_work():
                        self._poller = None
                        return
            fast = any(
                r.status.state in (ResizeState.PENDING, ResizeState.IN_PROGRESS)
                for s in list(self._sims.values()) for r in s.resizes.values()
            )  # fmt: skip
            self._closed.wait(min(self.config.poll_s, 0.05) if fast else self.config.poll_s)

    def poll_once(self) -> bool:
        """List the pods of every simulation once and act on what changed; False when no
        simulation needs watching any more."""
        if self._orphans:
            self._delete_orphans()
        with self._lock:
            sims = [s for s in self._sims.values() if not s.released]
        if not sims:
            return bool(self._orphans)
        try:
            pods = self.api.list_pods(builders.ALL_SIMS_SELECTOR)
        except KubeError as exc:
            self.poll_error = str(exc)
            return True
        self.poll_error = None
        for sim in sims:
            if sim.reconcile_error is not None and not sim.ended and sim.failure is None:
                self._retry_reconcile(sim)
        by_sim: dict[str, dict[int, Obj]] = {}
        for pod in pods:
            lab = pod.get("metadata", {}).get("labels") or {}
            with contextlib.suppress(KeyError, ValueError):
                by_sim.setdefault(lab[builders.SIM_LABEL], {})[int(lab[builders.RANK_LABEL])] = pod
        news = False
        with self._lock:
            for sim in sims:
                news |= self._update(sim, by_sim.get(sim.spec.sim_id, {}))
        if news:
            self._notify()
        return True

    def _retry_reconcile(self, sim: _Sim) -> None:
        try:
            self.reconcile(sim.spec, sim.image, sim.volume)
        except KubeError as exc:
            sim.reconcile_error = str(exc)
            if not exc.transient:
                sim.failure = f"cannot create the rank pods of {sim.spec.sim_id}: {exc}"
            return
        sim.reconcile_error = None

    def _delete_orphans(self) -> None:
        """One non-blocking attempt per orphan (the poller must not stall on one)."""
        for sim_id in sorted(self._orphans):
            try:
                gone = self.delete_objects(sim_id, wait=False)
            except BackendError:
                continue
            if gone:
                self._orphans.discard(sim_id)

    def _update(self, sim: _Sim, pods: dict[int, Obj]) -> bool:
        news = False
        for rank in range(sim.n):
            pod = pods.get(rank)
            old = sim.pods.get(rank)
            if pod is None:
                if rank in sim.seen and old is not None:
                    sim.pods.pop(rank)
                    news = True
                    if not sim.ended and not sim.stopped and sim.failure is None:
                        name = builders.pod_name(sim.spec.sim_id, rank)
                        sim.failure, sim.failure_rank = f"rank pod {name} was deleted", rank
                continue
            sim.seen.add(rank)
            if old is None or _version(old) != _version(pod):
                news = True
            sim.pods[rank] = pod
            why = status.failure(pod, C)
            if why is not None and not sim.ended and not sim.stopped and sim.failure is None:
                sim.failure, sim.failure_rank = why, rank
            resize = sim.resizes.get(rank)
            if resize is not None and not resize.status.state.final:
                news |= self._follow_resize(resize, pod)
        if (
            not sim.started
            and sim.failure is None
            and self.clock() - sim.created_t > self.config.start_timeout_s
        ):
            waiting = self._phase(sim)[1]
            sim.failure = (
                f"rank pods not running after {self.config.start_timeout_s:.0f} s: {waiting}"
            )
        if sim.failure is not None and not sim.failure_handled:
            self._fail(sim)
            return True
        if (
            not sim.started
            and not sim.ended
            and len(sim.pods) == sim.n
            and all(status.running(p, C) for p in sim.pods.values())
        ):
            self._start_mpirun(sim)
            if sim.failure is not None:
                self._fail(sim)
            news = True
        if sim.adopted and not sim.ended:
            news |= self._check_adopted(sim)
        return news

    def _event(self, sim: _Sim, rank: int, reason: str, message: str) -> None:
        """Record a Warning Event on the rank pod; best effort (never fails the caller)."""
        pod = sim.pods.get(rank) or {}
        body = builders.event(
            sim.spec.sim_id, builders.pod_name(sim.spec.sim_id, rank),
            pod.get("metadata", {}).get("uid"), reason, message,
            datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )  # fmt: skip
        with contextlib.suppress(KubeError):
            self.api.create("events", body)

    def _follow_resize(self, resize: _Resize, pod: Obj) -> bool:
        reading = status.resize_state(pod, C, resize.target, resize.generation)
        old = resize.status
        if reading.state is old.state and reading.reason == old.reason:
            return False
        latency = self.clock() - old.requested_t_s if reading.state.final else None
        resize.status = ResizeStatus(
            reading.state, old.from_millis, old.to_millis, old.requested_t_s,
            latency_s=latency, reason=reading.reason,
        )  # fmt: skip
        return True

    def _fail(self, sim: _Sim) -> None:
        """A rank pod is gone or broken: the MPI job cannot go on; end it now (once)."""
        sim.failure_handled = True
        self._event(sim, sim.failure_rank, "SimulationFailed", sim.failure or "failed")
        if sim.process is not None and sim.process.poll() is None:
            sim.process.kill_group(signal.SIGTERM)
        if sim.process is None:
            sim.ended = True

    def _check_adopted(self, sim: _Sim) -> bool:
        try:
            text = sim.exit_file.read_text().strip()
        except OSError:
            return False
        with contextlib.suppress(ValueError):
            sim.exit_code = int(text)
        sim.ended = True
        return True

    # -- resize ------------------------------------------------------------------------------

    def resize(self, sim_id: str, rank: int, resources: RankResources) -> ResizeStatus:
        sim = self._sim(sim_id)
        if not 0 <= rank < sim.n:
            raise BackendError(f"rank {rank} does not exist in {sim_id}")
        t0 = self.clock()
        old = sim.desired[rank]

        def result(
            state: ResizeState, reason: str = "", latency: float | None = None
        ) -> ResizeStatus:
            return ResizeStatus(state, old.request_millis, resources.request_millis, t0,
                                latency_s=latency, reason=reason)  # fmt: skip

        if sim.ended or sim.failure is not None:
            st = result(ResizeState.REJECTED, "the simulation has ended")
            with self._lock:
                sim.resizes[rank] = _Resize(st, resources, None)
            return st
        name = builders.pod_name(sim_id, rank)
        try:
            pod = self.api.patch_resize(name, builders.resize_patch(resources))
        except KubeError as exc:
            # 1.36 refuses a resize above the node's allocatable with Forbidden; validation
            # errors are 422; a vanished pod 404: all are final, the rank keeps its CPU.
            # An unreachable or overloaded apiserver, or a conflict, is FAILED: the control
            # loop asks again with back-off; a refusal is REJECTED.
            transient = exc.transient or exc.conflict
            state = ResizeState.FAILED if transient else ResizeState.REJECTED
            st = result(state, f"{exc.reason}: {exc.message}" if exc.message else str(exc))
            with self._lock:
                sim.resizes[rank] = _Resize(st, resources, None)
            change = f"cpu {old.request_millis}m -> {resources.request_millis}m"
            self._event(sim, rank, "ResizeRejected", f"{change}: {st.reason}")
            return st
        generation = pod.get("metadata", {}).get("generation")
        gen = int(generation) if generation is not None else None
        reading = status.resize_state(pod, C, resources, gen)
        if reading.state is ResizeState.COMPLETED:
            st = result(ResizeState.COMPLETED, latency=self.clock() - t0)
        else:
            st = result(ResizeState.PENDING)
        with self._lock:
            sim.desired[rank] = resources
            sim.resizes[rank] = _Resize(st, resources, gen)
        self._ensure_poller()
        return st

    # -- wait mode ---------------------------------------------------------------------------

    def set_wait_mode(self, sim_id: str, mode: str) -> None:
        """The shim's records are on the shared case volume, which this process mounts at
        the same path as the rank pods: the control word is written here, as locally, and
        every rank takes it up at its next wait. A simulation without the shim is refused
        (BackendError), as by every backend."""
        sim = self._sim(sim_id)
        if sim.spec.shim is None:
            raise BackendError(f"simulation {sim_id} runs without the shim: no wait mode to set")
        try:
            set_wait_modes(shim_dir(sim.spec.case_dir), sim.n, mode)
        except UserError as exc:
            raise BackendError(str(exc)) from exc

    # -- observe -----------------------------------------------------------------------------

    def observe(self, sim_id: str) -> SimObservation:
        now = self.clock()
        staged = self._stager.observe(sim_id, now) if sim_id not in self._sims else None
        if staged is not None:
            return staged
        sim = self._sim(sim_id)
        with self._lock:
            if sim.process is not None and sim.exit_code is None:
                code = sim.process.poll()
                if code is not None:
                    sim.exit_code, sim.ended = code, True
            ended = sim.ended or sim.failure is not None
            ranks = tuple(self._observe_rank(sim, i, ended) for i in range(sim.n))
            log_text = self._read_log(sim)
            phase, reason = self._phase(sim)
        return SimObservation(
            sim_id, now, phase, ranks, exit_code=sim.exit_code, reason=reason, log_text=log_text
        )

    def _phase(self, sim: _Sim) -> tuple[SimPhase, str]:
        """The simulation's phase and why (no side effects: `list` uses it too)."""
        if not (sim.ended or sim.failure is not None):
            if sim.started:
                return SimPhase.RUNNING, ""
            if self.poll_error:
                return SimPhase.PENDING, f"the API is not answering: {self.poll_error}"
            if sim.reconcile_error:
                return SimPhase.PENDING, f"creating its pods: {sim.reconcile_error}"
            return SimPhase.PENDING, "; ".join(
                f"rank {i}: {status.pending_reason(sim.pods.get(i))}"
                for i in range(sim.n)
                if not status.running(sim.pods.get(i) or {}, C)
            )
        if sim.failure is not None:
            return SimPhase.FAILED, sim.failure
        if sim.stopped:
            return SimPhase.FAILED, "stopped"
        if sim.exit_code == 0:
            return SimPhase.SUCCEEDED, ""
        return SimPhase.FAILED, _exit_reason(sim.exit_code)

    def _observe_rank(self, sim: _Sim, i: int, ended: bool) -> RankObservation:
        pod = sim.pods.get(i)
        counters = self.usage.read(pod) if pod is not None and status.running(pod, C) else None
        last = sim.counters.get(i)
        if counters is not None and (last is None or counters.usage_ns >= last.usage_ns):
            sim.counters[i] = counters
        counters = sim.counters.get(i) or usage.CpuCounters(0)
        if ended:
            ok = sim.exit_code == 0 and sim.failure is None and not sim.stopped
            phase = RankPhase.SUCCEEDED if ok else RankPhase.FAILED
        elif pod is None:
            phase = RankPhase.FAILED if i in sim.seen else RankPhase.PENDING
        else:
            phase = status.rank_phase(pod, C)
            if phase is RankPhase.RUNNING and not sim.started:
                phase = RankPhase.PENDING  # the pod runs; its rank does not yet
        compute = mpi = None
        duty = None
        wait_mode = None
        if i < len(sim.readers):
            with contextlib.suppress(UserError, OSError, ValueError):
                rec = sim.readers[i].snapshot()
                if rec is not None:
                    compute, mpi, duty = rec.compute_ns, rec.mpi_ns, rec.window_duty
                    wait_mode = rec.wait_mode
        resize = sim.resizes.get(i)
        return RankObservation(
            rank=i,
            phase=phase,
            desired=sim.desired[i],
            allocated=status.allocated(pod, C) if pod else None,
            usage_ns=counters.usage_ns,
            nr_throttled=counters.nr_throttled,
            throttled_ns=counters.throttled_ns,
            restarts=status.restarts(pod, C),
            reason=(status.failure(pod, C) or "") if pod else "",
            node=(pod or {}).get("spec", {}).get("nodeName"),
            pod=builders.pod_name(sim.spec.sim_id, i),
            resize=resize.status if resize else None,
            compute_ns=compute,
            mpi_ns=mpi,
            duty_window=duty,
            wait_mode=wait_mode,
        )

    def _read_log(self, sim: _Sim) -> str:
        try:
            with open(sim.spec.log_path, "rb") as fh:
                fh.seek(sim.log_offset)
                chunk = fh.read(8 << 20)
        except FileNotFoundError:
            return ""
        done = sim.ended or sim.failure is not None
        cut = chunk.rfind(b"\n") + 1 if not done else len(chunk)
        sim.log_offset += cut
        return chunk[:cut].decode("utf-8", errors="replace")

    # -- stop and release ----------------------------------------------------------------------

    def stop(self, sim_id: str) -> None:
        if sim_id not in self._sims and self._stager.cancel(sim_id):
            return
        sim = self._sims.get(sim_id)
        if sim is None:
            raise UnknownSimulation(f"no simulation {sim_id} in this backend")
        if sim.released:
            return
        with self._lock:
            if not sim.ended:
                sim.stopped = True
        process = sim.process
        if process is not None and process.poll() is None:
            process.kill_group(signal.SIGTERM)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill_group(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
        if sim.started:
            self._kill_in_pods(sim)
        with self._lock:
            if process is not None and sim.exit_code is None:
                sim.exit_code = process.returncode
            sim.ended = True
        self._notify()

    def _kill_in_pods(self, sim: _Sim) -> None:
        """Ranks and orteds that outlive mpirun: kill every process of each rank container
        but its idle pid 1 (``kill -9 -1`` spares pid 1 and the caller)."""
        argv = ["/bin/sh", "-c", "kill -9 -1 2>/dev/null; true"]

        def kill(rank: int) -> None:
            with contextlib.suppress(KubeError):
                self.api.exec(builders.pod_name(sim.spec.sim_id, rank), C, argv, 15.0)

        running = [i for i, p in sorted(sim.pods.items()) if status.running(p, C)]
        threads = [threading.Thread(target=kill, args=(i,), daemon=True) for i in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)

    def release(self, sim_id: str) -> None:
        if sim_id not in self._sims and self._stager.release(sim_id):
            return  # staged but never launched: the copy holds no results and is removed
        sim = self._sims.get(sim_id)
        if sim is None or sim.released:
            return
        if not sim.ended or (sim.process is not None and sim.process.poll() is None):
            self.stop(sim_id)
        try:
            self.delete_objects(sim_id)
        except BackendError:
            # The apiserver is away or the pods are slow to go: the poller deletes them
            # later; the simulation itself is over and its results are on the volume.
            self._orphans.add(sim_id)
            self._ensure_poller()
        if sim.log_file is not None:
            sim.log_file.close()
        for reader in sim.readers:
            reader.close()
        _close_launch(sim)
        with self._lock:
            sim.released = True

    def delete_objects(self, sim_id: str, *, wait: bool = True) -> bool:
        """Delete the owner (the garbage collector removes the Service and the pods) and
        wait, bounded, until the rank pods are gone; delete leftovers directly. Without
        ``wait``: one attempt, leftovers of a deleted owner deleted directly; True when no
        rank pod is left."""
        owner_gone = False
        try:
            self.api.delete("configmaps", builders.owner_name(sim_id), "Foreground")
        except KubeError as exc:
            if not exc.not_found:
                raise BackendError(f"cannot delete simulation {sim_id}: {exc}") from exc
            owner_gone = True
        deadline = self.clock() + self.config.release_timeout_s
        direct = False
        while True:
            left = self.api.list_pods(builders.sim_selector(sim_id))
            if not left:
                return True
            if not wait:
                if owner_gone:
                    for pod in left:
                        with contextlib.suppress(KubeError):
                            self.api.delete("pods", str(pod["metadata"]["name"]))
                return False
            if self.clock() > deadline:
                raise BackendError(
                    f"rank pods of {sim_id} still exist after {self.config.release_timeout_s} s"
                )
            if not direct and self.clock() > deadline - self.config.release_timeout_s / 2:
                for pod in left:  # no garbage collector at work? delete them ourselves
                    with contextlib.suppress(KubeError):
                        self.api.delete("pods", str(pod["metadata"]["name"]))
                with contextlib.suppress(KubeError):
                    self.api.delete("services", builders.service_name(sim_id))
                direct = True
            time.sleep(min(0.2, self.config.poll_s))

    def close(self) -> None:
        self._closed.set()

    def forget_all(self) -> list[str]:
        """Drop every simulation from this process's memory without stopping anything (the
        operator, when it stops leading: the next term, or the next leader, adopts them).
        Returns their ids."""
        with self._lock:
            sims, self._sims = self._sims, {}
            self._stager.forget_all()
        for sim in sims.values():
            _close_launch(sim)
            if sim.log_file is not None:
                with contextlib.suppress(OSError):
                    sim.log_file.close()
            for reader in sim.readers:
                with contextlib.suppress(OSError, UserError):
                    reader.close()
        return [k for k, v in sims.items() if not v.released]

    # -- earlier processes' simulations ------------------------------------------------------

    def list(self) -> tuple[SimRef, ...]:
        refs = []
        for owner in self.api.list("configmaps", builders.OWNERS_SELECTOR):
            lab = dict(owner.get("metadata", {}).get("labels") or {})
            sim_id = lab.get(builders.SIM_LABEL, "")
            sim = self._sims.get(sim_id)
            if sim is not None and sim.released:
                continue
            phase = self._phase(sim)[0] if sim is not None else _phase_from_exit(owner)
            refs.append(SimRef(sim_id, phase, lab))
        return tuple(refs)

    def adopt(self, sim_id: str, spec: SimSpec) -> None:
        """Take over a simulation an earlier rankpack process launched: its pods are
        followed again; its mpirun (not our child) is known to have ended by the exit file
        it leaves on the case volume. The launch marker (`launcher.state`) says whether
        mpirun was ever started: if not (the earlier process died mid-launch), the rank
        pods are created if missing and mpirun is started here once they run."""
        import json

        launch = launcher.state(rank_dir(spec.case_dir))
        try:
            owner = self.api.get("configmaps", builders.owner_name(sim_id))
        except KubeError as exc:
            if not exc.not_found:
                raise
            if launch in ("running", "died"):
                raise UnknownSimulation(
                    f"no simulation {sim_id} in {self.api.namespace} (its objects were "
                    "deleted while it ran)"
                ) from exc
            # ended: released, but the process that released it died before it recorded
            # the end (finish it from its exit code and log); never: it died before the
            # objects were created (create them now)
            owner = {}
        recorded = json.loads(owner.get("data", {}).get("spec.json", "{}"))
        image = str(recorded.get("image") or spec.image or self.config.image)
        try:
            volume = parse_volume(spec.volume, spec.case_dir)
        except UserError as exc:
            raise LaunchFailed(str(exc)) from exc
        sim = _Sim(spec=spec, image=image, volume=volume, desired=list(spec.ranks),
                   started=launch != "never", adopted=True)  # fmt: skip
        if launch == "never":
            self._prepare_files(sim)
            # whatever the earlier process got to (owner, service, some rank pods): creating
            # is get-or-create, so the missing ones are made and the existing ones kept
            try:
                self.reconcile(spec, image, volume)
            except KubeError as exc:
                if not exc.transient:
                    raise LaunchFailed(f"cannot create the rank pods of {sim_id}: {exc}") from exc
                sim.reconcile_error = str(exc)
        elif launch == "died":
            sim.failure = "its launcher and mpirun ended without an exit code (killed?)"
        listed = bool(owner) or (launch == "never" and sim.reconcile_error is None)
        for pod in self.api.list_pods(builders.sim_selector(sim_id)) if listed else []:
            with contextlib.suppress(KeyError, ValueError):
                rank = int(pod["metadata"]["labels"][builders.RANK_LABEL])
                want = status.desired(pod, C)
                if want is not None and 0 <= rank < sim.n:
                    sim.desired[rank] = want
                    sim.pods[rank] = pod
                    sim.seen.add(rank)
        self._attach_readers(sim)
        if launch == "ended":
            self._check_adopted(sim)
        # the log is delivered from its start, as the protocol says: the adopting
        # controller parses it afresh (sim.log_offset stays 0)
        with self._lock:
            self._sims[sim_id] = sim
        self._ensure_poller()

    def _sim(self, sim_id: str) -> _Sim:
        sim = self._sims.get(sim_id)
        if sim is None or sim.released:
            raise UnknownSimulation(f"no simulation {sim_id} in this backend")
        return sim


def _close_launch(sim: _Sim) -> None:
    """Let go of the launch marker (the launcher and mpirun, if any, still hold it)."""
    if sim.launch_fd is not None:
        with contextlib.suppress(OSError):
            os.close(sim.launch_fd)
        sim.launch_fd = None


def _version(obj: Obj) -> Any:
    return obj.get("metadata", {}).get("resourceVersion")


def _live(pod: Obj) -> bool:
    return pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")


def _phase_from_exit(owner: Obj) -> SimPhase:
    import json

    try:
        case_dir = Path(json.loads(owner.get("data", {}).get("spec.json", "{}"))["case_dir"])
        text = (rank_dir(case_dir) / "mpirun.exit").read_text().strip()
    except (OSError, KeyError, ValueError):
        return SimPhase.RUNNING
    return SimPhase.SUCCEEDED if text == "0" else SimPhase.FAILED


def _subnet_of(pods: list[Obj]) -> str | None:
    """The /24 holding every rank pod's IP (Open MPI's TCP interfaces), if there is one."""
    ips = [p.get("status", {}).get("podIP") for p in pods]
    if not ips or not all(ips):
        return None
    net = ipaddress.ip_network(f"{ips[0]}/24", strict=False)
    if all(ipaddress.ip_address(ip) in net for ip in ips):
        return str(net)
    return None


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "ended with an unknown status"
    if code < 0:
        return f"mpirun was killed by signal {-code}"
    return f"the MPI job exited with code {code}"


_PR_SET_PDEATHSIG = 1


def _terminate_with_parent() -> None:
    """In the forked mpirun: SIGTERM it if rankpack dies (it then takes its orteds down)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
