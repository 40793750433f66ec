"""`KubernetesBackend`: backend protocol v2 with one pod per MPI rank, resized in place.

Called by the control loop (`rankpack.controller.loop`) exactly like the local backend.
`launch` creates (idempotent: existing objects of the simulation are taken) the
simulation's owner ConfigMap, headless Service and rank pods (`reconcile`, from the pure
`builders`) and returns. Everything the backend reads of the cluster comes from one shared
cache (`informer`: each collection listed once, then watched; issue 29): the follower
thread (`poller`) acts on each change of the namespace's pods, starts ``mpirun`` on this
host once every rank pod of a simulation runs (`starting.hostmpirun`; ranks enter the pods through the
rsh agent, `rsh`), follows resizes from the pods' status as the watch brings it (`status`),
and turns a deleted or evicted rank pod into a failed simulation with a failure code. Each
simulation's state is one `record.SimRecord` whose `Lifecycle` both threads change under
one lock. `wait` wakes on the poller's and mpirun's news.
`observe` reads a record (`simreport`); counters and the shim's records come from the rank
pods' nodes (`readings`: this node's files, or the node agents), the solver log from the
shared case volume; `inventory` from the cached nodes, pods and quotas (`capacity`). Every
request sent is counted (`api_requests`).
See ``docs/decisions/0008-kubernetes-launcher.md`` and ``0010-node-agent.md``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from rankpack.backend.kubernetes import simreport
from rankpack.backend.kubernetes.api import informer
from rankpack.backend.kubernetes.api.config import KubernetesConfig, parse_volume
from rankpack.backend.kubernetes.api.kubeapi import ApiError, KubeApi, Obj
from rankpack.backend.kubernetes.nodes import lostnodes, readings
from rankpack.backend.kubernetes.nodes.capacity import ClusterCapacity
from rankpack.backend.kubernetes.objects import builders, limits, reconcile, status
from rankpack.backend.kubernetes.poller import Poller, check_adopted
from rankpack.backend.kubernetes.record import Lifecycle, PodResize, SimRecord, rank_dir
from rankpack.backend.kubernetes.starting import exitwrapper, podmode
from rankpack.backend.kubernetes.starting.hostmpirun import MpirunHost, Starter, prepare_files
from rankpack.backend.mpirun import stop_group
from rankpack.backend.protocol import (
    BackendError,
    Inventory,
    LaunchFailed,
    LaunchRefused,
    RankBounds,
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
from rankpack.core.actions import UnknownWaitMode, WaitMode, parse_wait_mode
from rankpack.core.failures import Failure, FailureCode
from rankpack.errors import UserError

C = builders.CONTAINER


log = logging.getLogger(__name__)


class KubernetesBackend:
    """One pod per rank in ``config.namespace``; mpirun on this host (decision 0008)."""

    name = "kubernetes"

    def __init__(
        self,
        api: KubeApi,
        config: KubernetesConfig,
        *,
        source: readings.Readings | None = None,
        starter: Starter | None = None,
        mpirun: str | None = None,
        background: bool = True,
        news: News | None = None,
    ) -> None:
        self.api = api
        self._config = config
        self.cache = informer.Cache(api, background=background)
        """The shared local cache of what this backend reads (`informer`)."""
        self._events_refused: set[str] = set()
        """Reasons whose Event the apiserver refused (logged once each)."""
        self.pods_collection = informer.core("pods", api.namespace)
        """The namespace's pods (rank and launcher pods among them), as the cache holds them."""
        self.readings = (
            source if source is not None else readings.choose(api, config, cache=self.cache)
        )
        """Where the ranks' counters and shim records come from (`readings.choose`)."""
        self.background = background
        self._stager = Stager(self.notify)
        self.sims: dict[str, SimRecord] = {}
        self.lock = threading.RLock()
        """Guards the records, which the control loop's thread and the poller's share."""
        self._news = news if news is not None else News()
        """What `wait` waits on (shared by the backends of several namespaces: `tenants`)."""
        self.host = MpirunHost(api, config, mpirun=mpirun, starter=starter, lock=self.lock,
                               notify=self.notify)  # fmt: skip
        self._poller = Poller(self)
        self._capacity = ClusterCapacity(api, config, self.cache)
        self.nodes = lostnodes.NodeWatch(self.cache)
        """Which nodes are lost (`lostnodes`: the cached nodes and their Leases)."""

    # -- capacity and facts ------------------------------------------------------------------

    @property
    def config(self) -> KubernetesConfig:
        return self._config

    @config.setter
    def config(self, config: KubernetesConfig) -> None:
        """A new configuration reaches the parts that keep one (tests change it)."""
        self._config = self._capacity.config = self.host.config = config

    def inventory(self) -> Inventory:
        return self._capacity.inventory()

    def rank_bounds(self) -> RankBounds | None:
        """What the namespace's LimitRanges allow a rank's request, read now (None: any)."""
        return limits.rank_bounds(self._capacity.limit_ranges())

    def placement(self) -> dict[str, str]:
        return {
            "namespace": self.api.namespace,
            "image": self.config.image,
            "usage": self.readings.name,
            "launcher": "launcher-pod" if self.config.launcher == "pod" else "mpirun+pods/exec",
        }

    def clock(self) -> float:
        return time.monotonic()

    def api_requests(self) -> dict[str, object]:
        """The requests this backend sent to the apiserver (and its rsh agents, one exec
        per rank pod when mpirun starts here), by verb and resource, per minute since it
        was made (`api.RequestCounter.summary`), and what each watched collection cost."""
        summary: dict[str, object] = dict(self.api.requests.summary())
        summary["watched"] = self.cache.stats()
        return summary

    def pods_left(self, sim_id: str) -> reconcile.PodsLeft:
        """A simulation's pods in the cache, after waiting for a change (`reconcile.delete`)."""

        def left(wait_s: float) -> list[Obj]:
            found = self.cache.informer(self.pods_collection)
            if wait_s > 0:
                found.wait(found.version, wait_s)
            return [p for p in found.items()
                    if (p.get("metadata", {}).get("labels") or {}).get(builders.SIM_LABEL)
                    == sim_id]  # fmt: skip

        return left

    # -- events ------------------------------------------------------------------------------

    def notify(self) -> None:
        """Wake `wait` now (the poller, mpirun's end, or the operator when a Simulation
        changed)."""
        self._news.notify()

    def wait(self, timeout_s: float) -> None:
        self._news.wait(timeout_s)

    # -- staging (on the shared volume, in a worker thread, like the local backend) --------

    def stage(self, spec: StageSpec) -> None:
        if spec.sim_id in self.sims:
            raise BackendError(f"simulation {spec.sim_id} exists already")
        self._stager.stage(spec)

    # -- launch ------------------------------------------------------------------------------

    def launch(self, spec: SimSpec) -> None:
        """Create the owner, the Service and the rank pods. Checked first against the
        namespace's LimitRanges and quotas, read now (`ClusterCapacity.launch_check`): no room
        in a quota is `LaunchRefused` (still staged, nothing created), a rank the
        LimitRange refuses is `LaunchFailed` with its code. A create the apiserver refuses
        halfway (another tenant took the quota between that check and the create) deletes
        what was created (`reconcile.undo`: no partial gang) and is `LaunchRefused` for
        quota, else `LaunchFailed`."""
        if spec.sim_id in self.sims:
            raise BackendError(f"simulation {spec.sim_id} was launched already")
        builders.check_sim_id(spec.sim_id, len(spec.ranks))
        in_pod = self.config.launcher == "pod"
        if in_pod:
            builders.check_launcher_name(spec.sim_id)
        check = self._capacity.launch_check(spec.ranks)
        refusal = check.refusal
        if refusal is not None and refusal[0] is FailureCode.QUOTA_EXCEEDED:
            raise LaunchRefused(f"{spec.sim_id} not launched: {refusal[1]}")
        stage = self._stager.launched(spec.sim_id)
        if refusal is not None:
            raise LaunchFailed(f"{spec.sim_id} not launched: {refusal[1]}", refusal[0])
        try:
            volume = parse_volume(spec.volume, spec.case_dir)
        except UserError as exc:
            raise LaunchFailed(str(exc)) from exc
        image = spec.image or self.config.image
        sim = SimRecord(spec=spec, image=image, volume=volume, desired=list(spec.ranks),
                        in_pod=in_pod)  # fmt: skip
        if check.launcher_millis != self.config.launcher_cpu_millis:
            sim.launcher_millis = check.launcher_millis  # within the namespace's LimitRange
        self._prepare(sim)
        try:
            sim.created_rv = reconcile.reconcile(
                self.api, spec, image, volume, launcher=podmode.options_of(sim, self.config),
                create_first=True,
            )  # fmt: skip
        except ApiError as exc:
            if not exc.transient:
                removed = reconcile.undo(self.api, spec.sim_id)
                why = f"cannot create the rank pods of {spec.sim_id}: {exc}"
                if exc.quota_exceeded:
                    self._stager.restore(stage)
                    raise LaunchRefused(
                        f"{why} (the {removed} created were deleted; waiting for room)"
                    ) from exc
                raise LaunchFailed(why, _create_failure(exc)) from exc
            # The apiserver is away: the poller creates what is missing once it answers
            # (get-or-create is idempotent), bounded by start_timeout_s like any start.
            sim.reconcile_error = str(exc)
        with self.lock:
            self.sims[spec.sim_id] = sim
        self._poller.ensure()

    def _prepare(self, sim: SimRecord) -> None:
        """The files on the case volume mpirun needs (and in pod mode its launcher's
        instructions)."""
        prepare_files(sim)
        if sim.in_pod:
            podmode.prepare(sim, self.config, self.api.namespace)

    # -- the poller: the backend's event source (`poller`) ------------------------------

    def poll_once(self) -> bool:
        """One round of the poller (tests drive it with ``background=False``)."""
        return self._poller.poll_once()

    @property
    def poll_error(self) -> str | None:
        return self._poller.error

    def record_event(self, sim: SimRecord, rank: int, reason: str, message: str) -> None:
        """Record a Warning Event on the rank pod; best effort (never fails the caller)."""
        pod = sim.pods.get(rank) or {}
        body = builders.event(
            sim.spec.sim_id, self.api.namespace, builders.pod_name(sim.spec.sim_id, rank),
            pod.get("metadata", {}).get("uid"), reason, message,
            datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )  # fmt: skip
        try:
            self.api.create("events", body)
        except ApiError as exc:  # said in the log, once per reason (a refusal is not silent)
            if reason not in self._events_refused:
                self._events_refused.add(reason)
                log.warning("the %s Event on %s was refused: %s", reason,
                            body["involvedObject"]["name"], exc)  # fmt: skip

    # -- resize ------------------------------------------------------------------------------

    def resize(self, sim_id: str, rank: int, resources: RankResources) -> ResizeStatus:
        sim = self._sim(sim_id)
        if not 0 <= rank < sim.n:
            raise BackendError(f"rank {rank} does not exist in {sim_id}")
        t0 = self.clock()
        old = sim.desired[rank]

        def result(
            state: ResizeState,
            reason: str = "",
            latency: float | None = None,
            code: FailureCode | None = None,
        ) -> ResizeStatus:
            return ResizeStatus(state, old.request_millis, resources.request_millis, t0,
                                latency_s=latency, reason=reason, code=code)  # fmt: skip

        if sim.life.over:
            st = result(ResizeState.REJECTED, "the simulation has ended")
            with self.lock:
                sim.resizes[rank] = PodResize(st, resources, None)
            return st
        name = builders.pod_name(sim_id, rank)
        try:
            pod = self.api.patch_resize(name, builders.resize_patch(resources))
        except ApiError as exc:
            # 1.36 refuses a resize above the node's allocatable with Forbidden; validation
            # errors are 422; a vanished pod 404: all are final, the rank keeps its CPU.
            # An unreachable or overloaded apiserver, or a conflict, is FAILED: the control
            # loop asks again with back-off; a refusal is REJECTED.
            # A grow past the namespace's quota (another tenant took it since the plan) is
            # refused with its own code: the rank keeps its CPU, nothing fails.
            transient = exc.transient or exc.conflict
            state = ResizeState.FAILED if transient else ResizeState.REJECTED
            code = (
                FailureCode.QUOTA_EXCEEDED if exc.quota_exceeded
                else FailureCode.OUTSIDE_LIMIT_RANGE if exc.outside_limit_range
                else None
            )  # fmt: skip
            st = result(state, f"{exc.reason}: {exc.message}" if exc.message else str(exc),
                        code=code)  # fmt: skip
            with self.lock:
                sim.resizes[rank] = PodResize(st, resources, None)
            change = f"cpu {old.request_millis}m -> {resources.request_millis}m"
            why = "QuotaExceeded" if exc.quota_exceeded else "ResizeRejected"
            self.record_event(sim, rank, why, f"{change}: {st.reason}")
            return st
        generation = pod.get("metadata", {}).get("generation")
        gen = int(generation) if generation is not None else None
        reading = status.resize_state(pod, C, resources, gen)
        if reading.state is ResizeState.COMPLETED:
            st = result(ResizeState.COMPLETED, latency=self.clock() - t0)
        else:
            st = result(ResizeState.PENDING)
        with self.lock:
            sim.desired[rank] = resources
            sim.resizes[rank] = PodResize(st, resources, gen)
        self._poller.ensure()
        return st

    # -- wait mode ---------------------------------------------------------------------------

    def set_wait_mode(self, sim_id: str, mode: WaitMode) -> None:
        """The control word is in each rank's record, in its pod's own volume: written on
        its node (`readings`: here, or by the node agent), every rank takes it up at its
        next wait. A simulation without the shim is refused (BackendError), as by every
        backend, and so is one whose ranks have not all published a record (asked again)."""
        sim = self._sim(sim_id)
        if sim.spec.shim is None:
            raise BackendError(f"simulation {sim_id} runs without the shim: no wait mode to set")
        try:
            parse_wait_mode(mode)
        except UnknownWaitMode as exc:
            raise BackendError(str(exc)) from None
        with self.lock:
            pods = [sim.pods.get(i) for i in range(sim.n)]
        running = [p for p in pods if p is not None and status.running(p, C)]
        if len(running) < sim.n:
            raise BackendError(f"{sim_id}: not every rank pod runs yet; try again")
        self.readings.set_wait_mode(sim_id, running, mode)

    # -- observe -----------------------------------------------------------------------------

    def observe(self, sim_id: str) -> SimObservation:
        now = self.clock()
        staged = self._stager.observe(sim_id, now) if sim_id not in self.sims else None
        if staged is not None:
            return staged
        sim = self._sim(sim_id)
        with self.lock:
            pods = list(sim.pods.values())
        self.readings.prefetch(pods)  # (a node agent may take its timeout: not under the lock)
        missing: dict[str, str] = {}
        with self.lock:
            life = sim.life
            if sim.process is not None and life.exit_code is None:
                code = sim.process.poll()
                if code is not None:
                    life.end(code)
            held = self.nodes.judge_end(sim)  # a lost node may be behind a failed end
            ended = life.over
            ranks = tuple(simreport.observe_rank(sim, i, ended, self.readings, missing)
                          for i in range(sim.n))  # fmt: skip
            outages = simreport.outages(sim, missing)
            log_text = sim.log.read(ended=ended)
            phase, reason = self.phase(sim) if held is None else (SimPhase.RUNNING, held)
            over = simreport.ended_failure(sim) if phase is SimPhase.FAILED else None
            failure = over.code if over is not None else None
        for node, why in outages:  # once per outage, on rank 0's pod
            self.record_event(sim, 0, "NodeAgentUnreachable",
                              f"node agent on {node} unreachable: {why}; no resize or wait-mode "
                              "change is decided for this simulation until it answers")  # fmt: skip
        return SimObservation(
            sim_id, now, phase, ranks, exit_code=life.exit_code, reason=reason, failure=failure,
            log_text=log_text,
        )  # fmt: skip

    def phase(self, sim: SimRecord) -> tuple[SimPhase, str]:
        """The simulation's phase and why (no side effects: `list` uses it too)."""
        phase, reason = simreport.phase(sim, self.poll_error)
        if sim.in_pod and phase is SimPhase.PENDING and not self.poll_error:
            reason = podmode.pending_reason(sim, reason)
        return phase, reason

    # -- stop and release ----------------------------------------------------------------------

    def stop(self, sim_id: str) -> None:
        if sim_id not in self.sims and self._stager.cancel(sim_id):
            return
        sim = self.sims.get(sim_id)
        if sim is None:
            raise UnknownSimulation(f"no simulation {sim_id} in this backend")
        if sim.life.released:
            return
        with self.lock:
            sim.life.stop()
        if sim.in_pod:  # mpirun runs in the launcher pod: its deletion ends it
            if not sim.life.ended:
                podmode.stop(self.api, sim)
            with self.lock:
                sim.life.end()
            self.notify()
            return
        process = sim.process
        if process is not None:
            stop_group(process)
        if sim.life.started:
            self.host.kill_in_pods(sim)
        with self.lock:
            sim.life.end(process.returncode if process is not None else None)
        self.notify()

    def release(self, sim_id: str) -> None:
        if sim_id not in self.sims and self._stager.release(sim_id):
            return  # staged but never launched: the copy holds no results and is removed
        sim = self.sims.get(sim_id)
        if sim is None or sim.life.released:
            return
        if not sim.life.ended or (sim.process is not None and sim.process.poll() is None):
            self.stop(sim_id)
        if sim.life.failure is not None and sim.life.failure.code is FailureCode.NODE_LOST:
            self.nodes.force_delete(self.api, sim)  # its kubelet will never confirm an end
        try:
            reconcile.delete(self.api, self.config, sim_id, self.pods_left(sim_id))
        except BackendError:
            # The apiserver is away or the pods are slow to go: the poller deletes them
            # later; the simulation itself is over and its results are on the volume.
            self._poller.orphans.add(sim_id)
            self._poller.ensure()
        if sim.log_file is not None:
            sim.log_file.close()
        sim.close_launch()
        with self.lock:
            sim.life.release()

    def discard(self, sim_id: str) -> None:
        """A simulation nobody holds any more (the operator's: its Simulation was deleted
        while no operator ran): stopped and its objects deleted. Deleting the owner takes
        its pods (a launcher pod's SIGTERM ends its mpirun); one attempt, the poller
        deletes leftovers later. Idempotent."""
        if sim_id in self.sims:
            self.release(sim_id)
            return
        try:
            gone = reconcile.delete(self.api, self.config, sim_id, self.pods_left(sim_id),
                                  wait=False)  # fmt: skip
        except BackendError:
            gone = False
        if not gone:
            self._poller.orphans.add(sim_id)
            self._poller.ensure()

    def close(self) -> None:
        self._poller.closed.set()
        self.cache.close()

    def forget_all(self) -> list[str]:
        """Drop every simulation from this process's memory without stopping anything (the
        operator, when it stops leading: the next term, or the next leader, adopts them).
        Returns their ids."""
        with self.lock:
            sims, self.sims = self.sims, {}
            self._stager.forget_all()
        for sim in sims.values():
            sim.close_launch()
            if sim.log_file is not None:
                with contextlib.suppress(OSError):
                    sim.log_file.close()
        return [k for k, v in sims.items() if not v.life.released]

    # -- earlier processes' simulations ------------------------------------------------------

    def list(self) -> tuple[SimRef, ...]:
        refs = []
        for owner in self.api.list("configmaps", builders.OWNERS_SELECTOR):
            lab = dict(owner.get("metadata", {}).get("labels") or {})
            sim_id = lab.get(builders.SIM_LABEL, "")
            sim = self.sims.get(sim_id)
            if sim is not None and sim.life.released:
                continue
            phase = self.phase(sim)[0] if sim is not None else _phase_from_exit(owner)
            refs.append(SimRef(sim_id, phase, lab))
        return tuple(refs)

    def adopt(self, sim_id: str, spec: SimSpec) -> None:
        """Take over a simulation an earlier rankpack process launched: its pods are
        followed again; its mpirun (not our child) is known to have ended by the exit file
        it leaves on the case volume. The launch marker (`exitwrapper.state`) says whether
        mpirun was ever started: if not (the earlier process died mid-launch), the rank
        pods (and in pod mode the launcher pod) are created if missing and mpirun is started
        once they run. A simulation with a launcher pod is followed through it (pod mode:
        running, ended, or lost)."""
        launch = exitwrapper.state(rank_dir(spec.case_dir))
        try:
            owner = self.api.get("configmaps", builders.owner_name(sim_id))
        except ApiError as exc:
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
        life = Lifecycle(adopted=True)
        if launch != "never":
            life.start()
        in_pod = self.config.launcher == "pod"
        sim = SimRecord(spec=spec, image=image, volume=volume, desired=list(spec.ranks),
                        life=life, in_pod=in_pod and launch == "never")  # fmt: skip
        if launch == "never":
            if sim.in_pod:
                builders.check_launcher_name(sim_id)
            self._prepare(sim)
            # whatever the earlier process got to (owner, service, some rank pods): creating
            # is get-or-create, so the missing ones are made and the existing ones kept
            try:
                sim.created_rv = reconcile.reconcile(
                    self.api, spec, image, volume, launcher=podmode.options_of(sim, self.config)
                )
            except ApiError as exc:
                if not exc.transient:
                    reconcile.undo(self.api, sim_id)  # no partial gang, whatever the reason
                    why = f"cannot create the rank pods of {sim_id}: {exc}"
                    if exc.quota_exceeded:
                        raise LaunchRefused(why) from exc
                    raise LaunchFailed(why, _create_failure(exc)) from exc
                sim.reconcile_error = str(exc)
        listed = bool(owner) or (launch == "never" and sim.reconcile_error is None)
        launcher_pod: Obj | None = None
        for pod in self.pods_left(sim_id)(0.0) if listed else []:
            labels = pod.get("metadata", {}).get("labels") or {}
            if labels.get(builders.ROLE_LABEL) == builders.LAUNCHER_ROLE:
                launcher_pod = pod
                continue
            with contextlib.suppress(KeyError, ValueError):
                rank = int(labels[builders.RANK_LABEL])
                want = status.desired(pod, C)
                if want is not None and 0 <= rank < sim.n:
                    sim.desired[rank] = want
                    sim.pods[rank] = pod
                    sim.seen.add(rank)
        if launcher_pod is not None:  # pod mode: the launcher pod says where it stands
            podmode.adopted(sim, launcher_pod)
        elif launch == "died":
            life.fail(
                podmode.lost_on_adoption(sim) if in_pod else
                Failure(FailureCode.OTHER,
                        "its launcher and mpirun ended without an exit code (killed?)")
            )  # fmt: skip
        if launch == "ended":
            check_adopted(sim)
        # the log is delivered from its start, as the protocol says: the adopting
        # controller parses it afresh (sim.log starts at offset 0)
        with self.lock:
            self.sims[sim_id] = sim
        self._poller.ensure()

    def _sim(self, sim_id: str) -> SimRecord:
        sim = self.sims.get(sim_id)
        if sim is None or sim.life.released:
            raise UnknownSimulation(f"no simulation {sim_id} in this backend")
        return sim


def _create_failure(exc: ApiError) -> FailureCode:
    """The code of a create the apiserver refused for good."""
    if exc.outside_limit_range:
        return FailureCode.OUTSIDE_LIMIT_RANGE
    if exc.quota_needs_limits:
        return FailureCode.QUOTA_NEEDS_LIMITS
    return FailureCode.LAUNCH_FAILED


def _phase_from_exit(owner: Obj) -> SimPhase:
    try:
        case_dir = Path(json.loads(owner.get("data", {}).get("spec.json", "{}"))["case_dir"])
        text = (rank_dir(case_dir) / "mpirun.exit").read_text().strip()
    except (OSError, KeyError, ValueError):
        return SimPhase.RUNNING
    return SimPhase.SUCCEEDED if text == "0" else SimPhase.FAILED
