"""`rankpack operator`: the one control loop, on the Simulations of a namespace.

Start-up: take the Lease (leader election: only the holder acts), then adopt every Running
Simulation an earlier operator launched (its mpirun outlives the operator: the backend is
configured with ``detach``), requeue the ones it claimed but never launched, and run the
control loop on the queue of Simulations. A watch on Simulations wakes the loop when one is
created or changed; it reconnects with back-off when the apiserver goes away. Losing the
Lease stops the loop at once (the simulations keep running; the next leader adopts them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rankpack.backend.kubernetes import KubernetesBackend, KubernetesConfig, connect
from rankpack.backend.protocol import BackendError
from rankpack.controller.loop import ControlLoop, LoopSettings, SimView
from rankpack.controller.observations import ControllerSettings
from rankpack.operator import crd
from rankpack.operator.metrics import OperatorMetrics
from rankpack.operator.queue import SimulationApi, SimulationQueue, StatusWriter
from rankpack.store import Store

log = logging.getLogger("rankpack.operator")


@dataclass(frozen=True)
class OperatorOptions:
    config: KubernetesConfig
    runs_root: Path
    db_path: Path
    identity: str = ""
    lease_name: str = "rankpack-operator"
    lease_s: int = 15
    """Lease duration (whole seconds, as the Lease stores it)."""
    renew_s: int = 10
    retry_s: int = 2
    metrics_port: int | None = None
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    capacity_millis: int | None = None
    wait_mode: str = "spin"
    until_idle: bool = False
    """Return once nothing is queued or running (tests, batch use); default: run forever."""
    status_interval_s: float = 2.0


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class OperatorResult:
    status: str
    """idle (nothing left, with until_idle) | stopped | lost-lease"""
    adopted: int
    requeued: int
    finished: list[str]


class _Lease:
    """Leader election on a coordination.k8s.io Lease (the official client's elector)."""

    def __init__(self, api_client: Any, opts: OperatorOptions, namespace: str) -> None:
        from kubernetes import client
        from kubernetes.leaderelection import electionconfig, leaderelection
        from kubernetes.leaderelection.resourcelock import leaselock

        election: Any = leaderelection
        config_module: Any = electionconfig
        lock_module: Any = leaselock

        self.leading = threading.Event()
        self.lost = threading.Event()
        lock = lock_module.LeaseLock(opts.lease_name, namespace, opts.identity)
        lock.api_instance = client.CoordinationV1Api(api_client)
        config = config_module.Config(
            lock, opts.lease_s, opts.renew_s, opts.retry_s,
            self.leading.set, self.lost.set,
        )  # fmt: skip
        self.elector = election.LeaderElection(config)
        self.thread = threading.Thread(target=self._run, daemon=True, name="lease")

    def _run(self) -> None:
        try:
            self.elector.run()
        finally:
            self.lost.set()

    def start(self) -> None:
        self.thread.start()


class _Watcher:
    """Wakes the loop when a Simulation changes; reconnects with back-off."""

    def __init__(self, api: SimulationApi, wake: Callable[[], None], stop: threading.Event):
        self.api, self.wake, self.stop = api, wake, stop
        self.thread = threading.Thread(target=self._run, daemon=True, name="watch")
        self.reconnects = 0

    def _run(self) -> None:
        from kubernetes import watch

        make_watch: Any = watch.Watch
        delay = 0.5
        while not self.stop.is_set():
            w = make_watch()
            try:
                for _event in w.stream(
                    self.api.custom.list_namespaced_custom_object, crd.GROUP, crd.VERSION,
                    self.api.namespace, crd.PLURAL, timeout_seconds=60,
                ):  # fmt: skip
                    delay = 0.5
                    self.wake()
                    if self.stop.is_set():
                        break
            except Exception as exc:  # apiserver gone, connection reset: retry
                log.info("watch on simulations: %s; reconnecting in %.1f s", exc, delay)
                self.reconnects += 1
                self.stop.wait(delay)
                delay = min(delay * 2, 10.0)
            finally:
                w.stop()


class _Display(StatusWriter):
    def __init__(self, queue: SimulationQueue, interval_s: float, metrics: OperatorMetrics,
                 store: Store, multiplex_id: int) -> None:  # fmt: skip
        super().__init__(queue, interval_s)
        self.metrics, self.store, self.multiplex_id = metrics, store, multiplex_id

    def update(self, now_s: float, sims: Sequence[SimView]) -> None:
        super().update(now_s, sims)
        self.metrics.update(self.queue.names, sims)
        self.metrics.count_events(self.store.events(multiplex_id=self.multiplex_id))


def run_operator(
    opts: OperatorOptions,
    *,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = lambda s: None,
) -> OperatorResult:
    stop = stop or threading.Event()
    identity = opts.identity or default_identity()
    opts = replace(opts, identity=identity, config=replace(opts.config, detach=True))
    backend: KubernetesBackend = connect(opts.config)
    api_client = backend.api.api_client  # type: ignore[attr-defined]
    sims = SimulationApi(api_client, opts.config.namespace)
    try:
        sims.list()
    except Exception as exc:
        raise BackendError(
            f"cannot list simulations.{crd.GROUP} in namespace {opts.config.namespace}: "
            f"{_first_line(exc)}; is the CRD installed (kubectl apply -f deploy/crd.yaml) and "
            "may this identity use it (deploy/role.yaml)?"
        ) from exc
    metrics = OperatorMetrics()
    if opts.metrics_port is not None:
        try:
            metrics.serve(opts.metrics_port)
        except OSError as exc:
            backend.close()
            raise BackendError(
                f"cannot serve metrics on port {opts.metrics_port}: {exc.strerror}; "
                "choose another --metrics-port"
            ) from exc
        say(f"metrics on :{opts.metrics_port}/metrics")
    lease = _Lease(api_client, opts, opts.config.namespace)
    lease.start()
    say(f"{identity}: waiting for the lease {opts.config.namespace}/{opts.lease_name}")
    while not lease.leading.wait(0.5):
        if stop.is_set():
            backend.close()
            return OperatorResult("stopped", 0, 0, [])
        if lease.lost.is_set():
            backend.close()
            raise BackendError(
                f"leader election on Lease {opts.config.namespace}/{opts.lease_name} failed "
                "(see the log above); may this identity use leases (deploy/role.yaml)?"
            )
    say(f"{identity}: leading")
    store = Store(opts.db_path)
    queue = SimulationQueue(sims, store, identity)
    capacity = opts.capacity_millis or backend.inventory().allocatable_millis
    multiplex_id = store.start_multiplex(
        capacity, opts.controller.max_concurrent, opts.wait_mode, "kubernetes-operator"
    )
    settings = LoopSettings(
        runs_root=opts.runs_root, controller=opts.controller, wait_mode=opts.wait_mode,
        capacity_millis=capacity, multiplex_id=multiplex_id, label=f"operator-{multiplex_id}",
        extra={"multiplex_id": multiplex_id, "operator": identity},
        image=opts.config.image, leave_running=True,
    )  # fmt: skip
    display = _Display(queue, opts.status_interval_s, metrics, store, multiplex_id)
    loop_stop = threading.Event()

    def watch_lease() -> None:
        while not (stop.is_set() or lease.lost.is_set()):
            time.sleep(0.2)
        loop_stop.set()
        backend._notify()

    threading.Thread(target=watch_lease, daemon=True).start()
    watcher = _Watcher(sims, backend._notify, loop_stop)
    watcher.thread.start()
    adopted = requeued = 0
    finished: list[str] = []
    status = "stopped"
    try:
        loop = ControlLoop(backend, store, queue, settings, display=display, stop=loop_stop)
        for a in queue.running_for_adoption():
            name = queue.names[a.job.queue_id]
            try:
                loop.adopt(a)
                adopted += 1
                say(f"adopted {name} (simulation {a.sim_id})")
            except BackendError as exc:
                queue.fail(name, "LostOnRestart", f"could not be adopted: {exc}")
                say(f"{name}: could not be adopted ({exc}); failed")
        for name in queue.claimed_not_launched():
            queue.requeue(name, "its operator stopped between claim and launch")
            requeued += 1
        while not loop_stop.is_set():
            result = loop.run()
            finished += [queue.names.get(o.queue_id, "?") for o in result.outcomes]
            if loop_stop.is_set():
                break
            if opts.until_idle and not queue.pending():
                status = "idle"
                break
            backend.wait(5.0)  # a watch event wakes it at once
            loop = ControlLoop(backend, store, queue, settings, display=display, stop=loop_stop)
    finally:
        loop_stop.set()
        if lease.lost.is_set() and not stop.is_set():
            status = "lost-lease"
        store.finish_multiplex(multiplex_id, status, {"adopted": adopted, "requeued": requeued,
                                                      "finished": finished})  # fmt: skip
        with contextlib.suppress(Exception):
            backend.close()
    return OperatorResult(status, adopted, requeued, finished)


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [""])[0][:200]
