"""`KubernetesBackend`: backend protocol v2 with one pod per MPI rank, resized in place.

Called by the control loop (`rankpack.controller.loop`) exactly like the local backend.
The backend holds its parts and delegates: what they share is one `state.BackendState`
(the API, the settings, the shared cache, the simulations' records under one lock);
`launch` (a new simulation's checks, record and objects: owner ConfigMap, headless Service,
rank pods from the pure `builders`), `adoption` (earlier processes' simulations),
`resizing` (``pods/resize``) and the follower thread, `poller`, which acts on each change
of the namespace's pods as the shared cache (`informer`: listed once, then watched; issue
29) brings it: starts ``mpirun`` on this host once every rank pod runs
(`starting.hostmpirun`; ranks enter the pods through the rsh agent, `rsh`), follows
resizes, turns a deleted or evicted rank pod into a failed simulation with a failure code.
`observe` reads a record (module `observe`); counters and the shim's records come from the rank
pods' nodes (`readings`: this node's files, or the node agents), the solver log from the
shared case volume; `inventory` from the cached nodes, pods and quotas (`capacity`). Every
request sent is counted (`api_requests`).
See ``docs/decisions/0008-kubernetes-launcher.md`` and ``0010-node-agent.md``.
"""

from __future__ import annotations

import contextlib
import threading
import time

from rankpack.backend.kubernetes import adoption, lostnodes, resizing
from rankpack.backend.kubernetes import observe as report
from rankpack.backend.kubernetes.api import informer
from rankpack.backend.kubernetes.api.config import DEV_IMAGE, KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import KubeApi
from rankpack.backend.kubernetes.launch import launch_sim
from rankpack.backend.kubernetes.nodes import readings, sources
from rankpack.backend.kubernetes.nodes.agents import AgentReadings
from rankpack.backend.kubernetes.nodes.capacity import ClusterCapacity
from rankpack.backend.kubernetes.objects import builders, limits, reconcile, status
from rankpack.backend.kubernetes.podstaging import PodStaging
from rankpack.backend.kubernetes.poller import Poller
from rankpack.backend.kubernetes.record import SimRecord
from rankpack.backend.kubernetes.starting import podmode
from rankpack.backend.kubernetes.starting.hostmpirun import MpirunHost, Starter
from rankpack.backend.kubernetes.state import BackendState
from rankpack.backend.mpirun import stop_group
from rankpack.backend.protocol import (
    BackendError,
    Inventory,
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
from rankpack.backend.worker import News, Stager, stage_here
from rankpack.case import staging
from rankpack.case.staging import StagedCase
from rankpack.core.actions import UnknownWaitMode, WaitMode, parse_wait_mode
from rankpack.core.failures import FailureCode

C = builders.CONTAINER


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
        self._state = BackendState(api, config, background=background,
                                   news=news if news is not None else News())  # fmt: skip
        self.cache: informer.Cache = self._state.cache
        """The shared local cache of what this backend reads (`informer`)."""
        self.pods_collection = self._state.pods_collection
        self.sims: dict[str, SimRecord] = self._state.sims
        self.lock = self._state.lock
        """Guards the records, which the control loop's thread and the poller's share."""
        self.readings = (
            source if source is not None else sources.choose(api, config, cache=self.cache)
        )
        """Where the ranks' counters and shim records come from (`sources.choose`)."""
        self.nodes = lostnodes.NodeWatch(self.cache)
        """Which nodes are lost (`lostnodes`: the cached nodes and their Leases)."""
        self._pod_staging = PodStaging(self._state, lost=self.nodes.lost)
        self._stager = Stager(self.notify, run=self._stage_run, check=self._stage_check)
        self.host = MpirunHost(api, config, mpirun=mpirun, starter=starter, lock=self.lock,
                               notify=self.notify)  # fmt: skip
        self._poller = Poller(self._state, self.host, self.nodes, background=background)
        agents = self.readings if isinstance(self.readings, AgentReadings) else None
        self._capacity = ClusterCapacity(
            api, config, self.cache, node_requests=agents.node_requests if agents else None
        )

    # -- capacity and facts ------------------------------------------------------------------

    @property
    def api(self) -> KubeApi:
        return self._state.api

    @api.setter
    def api(self, api: KubeApi) -> None:
        self._state.api = api

    @property
    def config(self) -> KubernetesConfig:
        return self._state.config

    @config.setter
    def config(self, config: KubernetesConfig) -> None:
        """A new configuration reaches the parts that keep one (tests change it)."""
        self._state.config = self._capacity.config = self.host.config = config

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
        was made (`kubeapi.RequestCounter.summary`), and what each watched collection
        cost."""
        summary: dict[str, object] = dict(self.api.requests.summary())
        summary["watched"] = self.cache.stats()
        return summary

    # -- events ------------------------------------------------------------------------------

    def notify(self) -> None:
        """Wake `wait` now (the poller, mpirun's end, or the operator when a Simulation
        changed)."""
        self._state.notify()

    def wait(self, timeout_s: float) -> None:
        self._state.news.wait(timeout_s)

    # -- staging (a confined case in a staging pod, `podstaging`; else in a worker thread) --

    def in_pod(self, spec: StageSpec) -> bool:
        """Whether ``spec`` is staged in a staging pod: a case of a user with fewer rights
        (``confined``), unless the image is the dev cluster's host-``/usr`` one (no rankpack
        in it to stage with; the operator says so when it starts)."""
        return spec.confined and self.config.image != DEV_IMAGE

    def _stage_run(self, spec: StageSpec, stop: threading.Event) -> StagedCase:
        if self.in_pod(spec):
            return self._pod_staging.run(spec, stop)
        return stage_here(spec, stop)

    def _stage_check(self, spec: StageSpec) -> None:
        if self.in_pod(spec):
            self._pod_staging.check(spec)
        else:
            staging.check(spec)

    def stage(self, spec: StageSpec) -> None:
        if spec.sim_id in self.sims:
            raise BackendError(f"simulation {spec.sim_id} exists already")
        self._stager.stage(spec)

    # -- launch, resize (`launch`, `resizing`); the poller follows them (`poller`) ---------

    def launch(self, spec: SimSpec) -> None:
        """Create the owner, the Service and the rank pods (`launch.launch_sim`: checked first
        against the namespace's LimitRanges and quotas; no partial gang)."""
        if spec.sim_id in self.sims:
            raise BackendError(f"simulation {spec.sim_id} was launched already")
        sim = launch_sim(self._state, spec, self._capacity, self._stager)
        with self.lock:
            self.sims[spec.sim_id] = sim
        self._poller.ensure()

    def poll_once(self) -> bool:
        """One round of the poller (tests drive it with ``background=False``)."""
        return self._poller.poll_once()

    @property
    def poll_error(self) -> str | None:
        return self._poller.error

    def resize(self, sim_id: str, rank: int, resources: RankResources) -> ResizeStatus:
        st = resizing.resize(self._state, self.readings, self._sim(sim_id), rank, resources)
        if st.state in (ResizeState.COMPLETED, ResizeState.PENDING):
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
            pods = sim.group_pods()
        running = [p for p in pods if status.running(p, C)]
        if len(running) < len(sim.groups):
            raise BackendError(f"{sim_id}: not every rank pod runs yet; try again")
        self.readings.set_wait_mode(sim_id, running, mode)

    # -- observe -----------------------------------------------------------------------------

    def observe(self, sim_id: str) -> SimObservation:
        now = self.clock()
        staged = self._stager.observe(sim_id, now) if sim_id not in self.sims else None
        if staged is not None:
            return staged
        sim = self._sim(sim_id)
        if sim.nices_due:
            resizing.set_nices(self._state, self.readings, sim)
        with self.lock:
            pods = sim.group_pods()
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
            ranks = tuple(report.observe_rank(sim, i, ended, self.readings, missing)
                          for i in range(sim.n))  # fmt: skip
            outages = report.outages(sim, missing)
            log_text = sim.log.read(ended=ended)
            phase, reason = self.phase(sim) if held is None else (SimPhase.RUNNING, held)
            over = report.ended_failure(sim) if phase is SimPhase.FAILED else None
            failure = over.code if over is not None else None
        if phase.ended:
            ranks = report.with_finals(sim, ranks)
        for node, why in outages:  # once per outage, on rank 0's pod
            self._state.record_event(sim, 0, "NodeAgentUnreachable",
                              f"node agent on {node} unreachable: {why}; no resize or wait-mode "
                              "change is decided for this simulation until it answers")  # fmt: skip
        return SimObservation(
            sim_id, now, phase, ranks, exit_code=life.exit_code, reason=reason, failure=failure,
            log_text=log_text,
        )  # fmt: skip

    def phase(self, sim: SimRecord) -> tuple[SimPhase, str]:
        """The simulation's phase and why (no side effects: `list` uses it too)."""
        return report.phase(sim, self.poll_error)

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
            reconcile.delete(self.api, self.config, sim_id, self._state.pods_left(sim_id))
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
            gone = reconcile.delete(self.api, self.config, sim_id, self._state.pods_left(sim_id),
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
            sims = dict(self.sims)
            self.sims.clear()
            self._stager.forget_all()
        for sim in sims.values():
            sim.close_launch()
            if sim.log_file is not None:
                with contextlib.suppress(OSError):
                    sim.log_file.close()
        return [k for k, v in sims.items() if not v.life.released]

    # -- earlier processes' simulations (`adoption`) ------------------------------------------

    def list(self) -> tuple[SimRef, ...]:
        return adoption.listed(self._state, self.poll_error)

    def adopt(self, sim_id: str, spec: SimSpec) -> None:
        """Take over a simulation an earlier rankpack process launched (`adoption.adopt`):
        its pods are followed again."""
        sim = adoption.adopt(self._state, sim_id, spec)
        with self.lock:
            self.sims[sim_id] = sim
        self._poller.ensure()

    def _sim(self, sim_id: str) -> SimRecord:
        sim = self.sims.get(sim_id)
        if sim is None or sim.life.released:
            raise UnknownSimulation(f"no simulation {sim_id} in this backend")
        return sim
