"""The Kubernetes backend's event source: one thread that follows the rank pods and acts.

`Poller` runs while any simulation (or an orphan whose objects are still to delete) needs
watching. It reads the pods of all simulations from the shared cache (`informer`: the
namespace's pods, listed once and then watched) each time a watch event changes it, and at
least every ``poll_s`` for its timers (a start timeout, a create to retry, orphans to
delete): no request to the apiserver is made to look. Each round records each pod, turns a
deleted, evicted or broken rank pod into the simulation's failure (`status.failure`: a code
and a message), follows resizes from the pods' status (a resize completes when the watch
brings the pod whose status shows it), fails a simulation with a pod on a lost node
``NodeLost`` (`lostnodes`), starts mpirun once every rank pod runs
(`hostmpirun.MpirunHost`; in pod mode it follows each simulation's launcher pod instead,
`podmode`), and wakes the control loop (`notify`) when something changed. It sees of its
backend only what the backend's parts share (`state.BackendState`: the API, the settings,
the cache, the records under their lock) and the two parts it drives (the `MpirunHost`,
the `NodeWatch`); `KubernetesBackend` makes it and calls `ensure`, `poll_once`, `error`,
`orphans` and `closed`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any

from rankpack import untrusted
from rankpack.backend.kubernetes import lostnodes, observe
from rankpack.backend.kubernetes.api.informer import Informer, selected
from rankpack.backend.kubernetes.api.kubeapi import ApiError, Obj
from rankpack.backend.kubernetes.lostnodes import NodeWatch
from rankpack.backend.kubernetes.objects import builders, reconcile, status
from rankpack.backend.kubernetes.objects.grouppods import pod_ranks
from rankpack.backend.kubernetes.record import PodResize, SimRecord
from rankpack.backend.kubernetes.starting import podmode
from rankpack.backend.kubernetes.starting.exitwrapper import read_exit
from rankpack.backend.kubernetes.starting.hostmpirun import MpirunHost
from rankpack.backend.kubernetes.state import BackendState
from rankpack.backend.protocol import BackendError, ResizeStatus
from rankpack.core.failures import Failure, FailureCode

C = builders.CONTAINER
EXIT_LOOK_S = 0.1
"""How often the poll thread looks for the exit file of an mpirun that runs in a launcher
pod (a read of at most 64 bytes per such simulation, nothing when it is not there)."""


class Poller:
    """The poll thread of one `KubernetesBackend` (started on demand, ends when idle)."""

    def __init__(
        self, state: BackendState, host: MpirunHost, nodes: NodeWatch, *, background: bool
    ) -> None:
        self.state = state
        self.host = host
        self.nodes = nodes
        self.background = background
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()
        """Guards starting and ending the thread, so work added while it ends is seen."""
        self.closed = threading.Event()
        self.error: str | None = None
        """The last listing's error while the apiserver does not answer (None: it does)."""
        self.orphans: set[str] = set()
        """Released simulations whose objects could not be deleted yet (apiserver away)."""

    def ensure(self) -> None:
        if not self.background:
            return
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, daemon=True)
                self.thread.start()

    def _has_work(self) -> bool:
        return bool(self.orphans) or bool(self.state.live())

    def _loop(self) -> None:
        while not self.closed.is_set():
            config = self.state.config
            pods = self._informer()
            seen = pods.version if pods is not None else -1
            busy = self.poll_once()
            if not busy:
                with self.lock:  # ends only if nothing arrived meanwhile
                    if not self._has_work():
                        self.thread = None
                        return
            if pods is None:  # not listed yet (the apiserver did not answer): try again
                self.closed.wait(config.poll_s)
            else:  # until the watch brings a change, mpirun's exit, or the timers are due
                self._wait(pods, seen, config.poll_s)

    def _wait(self, pods: Informer, seen: int, timeout_s: float) -> None:
        """`Informer.wait`, but while mpirun runs in a launcher pod, in steps of
        `EXIT_LOOK_S` that end once its exit file is written: its launcher wrote it as
        mpirun ended, a second before the kubelet's next look at the pod would show it."""
        clock = self.state.clock
        deadline = clock() + timeout_s
        while not self.closed.is_set():
            left = deadline - clock()
            running = [s for s in self.state.live() if s.in_pod and s.life.started
                       and not s.life.ended]  # fmt: skip
            if left <= 0 or pods.wait(seen, min(left, EXIT_LOOK_S) if running else left) != seen:
                return
            if any(read_exit(s.exit_file) is not None for s in running):
                return  # (what `podmode.follow` ends it on: a file that does not parse waits)

    def _informer(self) -> Informer | None:
        found = self.state.cache.informers().get(self.state.pods_collection)
        return found if found is not None and found.synced else None

    def poll_once(self) -> bool:
        """Read the pods of every simulation from the cache and act on what changed; False
        when no simulation needs watching any more."""
        b = self.state
        if self.orphans:
            self._delete_orphans()
        sims = b.live()
        if not sims:
            return bool(self.orphans)
        try:
            informer = b.cache.informer(b.pods_collection)
        except ApiError as exc:
            self.error = str(exc)
            return True
        self.error = informer.error
        pods = [p for p in informer.items() if selected(p, builders.ALL_SIMS_SELECTOR)]
        for sim in sims:
            if sim.reconcile_error is not None and not sim.life.over:
                self._retry_reconcile(sim)
        by_sim: dict[str, dict[int, Obj]] = {}
        launchers = _launcher_pods(pods)
        for pod in pods:
            sim_label = (pod.get("metadata", {}).get("labels") or {}).get(builders.SIM_LABEL)
            for rank in pod_ranks(pod):
                by_sim.setdefault(str(sim_label), {})[rank] = pod
        news = False
        lost = self.nodes.lost()
        with b.lock:
            for sim in sims:
                sim_id = sim.spec.sim_id
                caught_up = informer.caught_up(sim.created_rv)
                news |= self._update(sim, by_sim.get(sim_id, {}), launchers.get(sim_id),
                                     caught_up)  # fmt: skip
                news |= self._lost(sim, lost)
        if news:
            b.notify()
        return True

    def _retry_reconcile(self, sim: SimRecord) -> None:
        launcher = podmode.options_of(sim, self.state.config, self.state.api.namespace)
        try:
            sim.created_rv = reconcile.reconcile(self.state.api, sim.spec, sim.groups, sim.image,
                                                 sim.volume, launcher=launcher,
                                                 bounds=self.state.config.pod_bounds)  # fmt: skip
        except ApiError as exc:
            sim.reconcile_error = str(exc)
            if not exc.transient:
                why = f"cannot create the rank pods of {sim.spec.sim_id}: {exc}"
                sim.life.fail(Failure(FailureCode.LAUNCH_FAILED, why))
            return
        sim.reconcile_error = None

    def _delete_orphans(self) -> None:
        """One non-blocking attempt per orphan (the poller must not stall on one)."""
        for sim_id in sorted(self.orphans):
            try:
                gone = reconcile.delete(self.state.api, self.state.config, sim_id,
                                        self.state.pods_left(sim_id), wait=False)  # fmt: skip
            except BackendError:
                continue
            if gone:
                self.orphans.discard(sim_id)

    def _update(
        self, sim: SimRecord, pods: dict[int, Obj], launcher: Obj | None, caught_up: bool = True
    ) -> bool:
        """Act on a simulation's pods as the cache holds them (``caught_up``: the cache has
        taken in the simulation's own creates, so a pod missing from it is gone)."""
        b, life = self.state, sim.life
        news = False
        for rank in range(sim.n):
            pod = pods.get(rank)
            if pod is not None and pod.get("metadata", {}).get("name") != sim.pod_name(rank):
                pod = None  # (a pod whose annotation claims another group's rank)
            old = sim.pods.get(rank)
            if pod is None:
                if rank in sim.seen and old is not None:
                    sim.pods.pop(rank)
                    news = True
                    name = sim.pod_name(rank)
                    life.fail(
                        Failure(FailureCode.POD_DELETED, f"rank pod {name} was deleted"), rank
                    )
                continue
            sim.seen.add(rank)
            if old is None or _version(old) != _version(pod):
                news = True
            sim.pods[rank] = pod
            why = status.failure(pod, C)
            if why is not None:
                life.fail(why, rank)
            resize = sim.resizes.get(rank)
            if resize is not None and not resize.status.state.final:
                news |= self._follow_resize(resize, pod)
        ranks_running = len(sim.pods) == sim.n and all(
            status.running(p, C) for p in sim.pods.values()
        )
        if sim.in_pod:  # mpirun runs in the launcher pod: follow it
            news |= podmode.follow(sim, launcher, ranks_running, caught_up=caught_up)
        if not life.started and life.failure is None:
            self._check_unschedulable(sim)
        if (
            not life.started
            and life.failure is None
            and b.clock() - sim.created_t > b.config.start_timeout_s
        ):
            waiting = observe.phase(sim, self.error)[1]
            late = f"rank pods not running after {b.config.start_timeout_s:.0f} s: {waiting}"
            life.fail(Failure(FailureCode.NOT_RUNNING, late))
        if self._handle_failure(sim):
            return True
        if not sim.in_pod and not life.started and not life.ended and ranks_running:
            self.host.start(sim)
            self._handle_failure(sim)
            news = True
        if life.adopted and not life.ended:
            news |= check_adopted(sim)
        return news

    def _check_unschedulable(self, sim: SimRecord) -> None:
        """A pod of a launch the scheduler cannot place for `unschedulable_s`: the launch
        fails ``Unschedulable`` with the scheduler's reason (the controller rolls it back
        into the queue, `Requeue.unschedulable`), not ``NotRunning`` minutes later."""
        b = self.state
        pods = [*((sim.pod_name(r), p) for r, p in sorted(sim.pods.items())),
                *(((str(sim.launcher["metadata"]["name"]), sim.launcher),)
                  if sim.launcher is not None else ())]  # fmt: skip
        found = next(((name, why) for name, p in pods
                      if (why := status.unschedulable(p)) is not None), None)  # fmt: skip
        if found is None:
            sim.unschedulable_t = None
            return
        if sim.unschedulable_t is None:
            sim.unschedulable_t = b.clock()
        elif b.clock() - sim.unschedulable_t >= b.config.unschedulable_s:
            name, why = found
            sim.life.fail(Failure(FailureCode.UNSCHEDULABLE,
                                  f"pod {name} cannot be scheduled: {why}"))  # fmt: skip

    def _lost(self, sim: SimRecord, lost: dict[str, str]) -> bool:
        """A simulation with a pod on a lost node cannot go on: ``NodeLost`` (also when its
        mpirun ended with a failure first, `lostnodes.judge_end`); ended now, once."""
        if not lost or sim.life.stopped:
            return False
        found = lostnodes.hit(sim, lost)
        if found is None:
            return False
        rank, why = found
        if sim.life.ended:
            if self.nodes.judge_end(sim) is not None or sim.life.failure is None:
                return False
        else:
            sim.life.fail(lostnodes.lost_failure(sim, why), max(rank, 0))
        return self._handle_failure(sim)

    def _follow_resize(self, resize: PodResize, pod: Obj) -> bool:
        reading = status.resize_state(pod, C, resize.target, resize.generation)
        old = resize.status
        if reading.state is old.state and reading.reason == old.reason:
            return False
        latency = self.state.clock() - old.requested_t_s if reading.state.final else None
        resize.status = ResizeStatus(
            reading.state, old.from_millis, old.to_millis, old.requested_t_s,
            latency_s=latency, reason=reading.reason,
        )  # fmt: skip
        return True

    def _handle_failure(self, sim: SimRecord) -> bool:
        """A rank pod is gone or broken: the MPI job cannot go on; end it now (once)."""
        failure = sim.life.failure_to_handle()
        if failure is None:
            return False
        self.state.record_event(sim, sim.life.failure_rank, "SimulationFailed", failure.message)
        if sim.in_pod:
            podmode.end_on_failure(self.state.api, sim)
        if sim.process is not None and sim.process.poll() is None:
            sim.process.kill_group(signal.SIGTERM)
        if sim.process is None:
            sim.life.end()
        return True


def check_adopted(sim: SimRecord) -> bool:
    """An adopted simulation's mpirun (not our child) has ended when its exit file exists."""
    try:
        text = untrusted.read_text(sim.exit_file, 64).strip()
    except OSError:
        return False
    with contextlib.suppress(ValueError):
        sim.life.exit_code = int(text)
    sim.life.end()
    return True


def _version(obj: Obj) -> Any:
    return obj.get("metadata", {}).get("resourceVersion")


def _launcher_pods(pods: list[Obj]) -> dict[str, Obj]:
    """The launcher pods (pod mode) of a listing, by simulation."""
    out: dict[str, Obj] = {}
    for pod in pods:
        lab = pod.get("metadata", {}).get("labels") or {}
        if lab.get(builders.ROLE_LABEL) == builders.LAUNCHER_ROLE and builders.SIM_LABEL in lab:
            out[str(lab[builders.SIM_LABEL])] = pod
    return out
