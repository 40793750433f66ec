"""`rankpack operator`: the one control loop, on the Simulations of the served namespaces.

Start-up: take the Lease (leader election: only the holder acts), then adopt every Running
Simulation an earlier operator launched (its mpirun outlives the operator: the backend is
configured with ``detach``), requeue the ones it claimed but never launched, and run the
control loop on the queue of Simulations. The Simulations are read from a cache (`simcache`:
listed once, then watched from their resourceVersion; the watch resumes after the apiserver
went away), whose changes wake the loop. Each served namespace has its own backend and Role
(`rankpack.operator.tenancy`); the Lease is in the operator's own namespace
(``config.namespace``).

A *term* is one stretch of leadership. The apiserver going away is not fatal: for a few
seconds the loop carries on with what it knows (status patches and Events wait, resizes
that fail are retried with back-off, nothing new is launched); once the Lease cannot be
renewed (``renew_s``) the term ends — the simulations keep running, nothing is stopped —
and the operator follows again: when it (or another operator) takes the Lease, that leader
adopts them from the cluster's state, exactly as after a crash. SIGTERM/Ctrl-C end the
operator and leave the simulations running for the next leader.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from rankpack.backend.kubernetes.api.client import ClientKubeApi
from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import ApiError, Obj
from rankpack.backend.kubernetes.connect import connect_namespaces
from rankpack.backend.kubernetes.tenants import NamespacedBackends
from rankpack.backend.protocol import BackendError, UnknownSimulation
from rankpack.controller.loop import Adopted, ControlLoop, LoopSettings, SimView
from rankpack.controller.observations import ControllerSettings
from rankpack.core.failures import FailureCode
from rankpack.errors import UserError
from rankpack.operator import crd
from rankpack.operator.admission import (
    AdmissionPolicy,
    NamespaceLimits,
    openfoam_applications,
)
from rankpack.operator.events import QUOTA_CODES, SimulationEvents
from rankpack.operator.lease import Lease, LeaseTerms
from rankpack.operator.metrics import OperatorMetrics
from rankpack.operator.queue import SimulationApi, SimulationQueue
from rankpack.operator.simcache import SimulationCache
from rankpack.operator.status import StatusWriter
from rankpack.operator.tenancy import Tenancy
from rankpack.store import EventRow, Store

log = logging.getLogger("rankpack.operator")


@dataclass(frozen=True)
class OperatorOptions:
    config: KubernetesConfig
    """The cluster; its ``namespace`` is the operator's own (its Lease's)."""
    runs_root: Path
    """Where run directories are staged; ``{namespace}`` is the Simulation's namespace."""
    db_path: Path
    identity: str = ""
    lease_name: str = "rankpack-operator"
    lease_s: int = 15
    """Lease duration (whole seconds, as the Lease stores it)."""
    renew_s: int = 10
    """A leader that cannot renew its Lease for this long stops acting (ends its term)."""
    retry_s: int = 2
    metrics_port: int | None = None
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    capacity_millis: int | None = None
    wait_mode: str = "auto"
    """auto, spin, polite or adaptive: for Simulations whose spec has no ``wait``."""
    until_idle: bool = False
    """Return once nothing is queued or running (tests, batch use); default: run forever."""
    status_interval_s: float = 10.0
    """At most one status patch per Simulation per this many seconds (progress, holds,
    conditions); a phase change or a launch is written at once (issue 29)."""
    plot: Path | None = None
    """Write the session's timeline PNG here when the operator ends."""
    volume: str | None = None
    """The rank pods' case volume for Simulations whose spec names none (``{namespace}``:
    the Simulation's)."""
    namespaces: tuple[str, ...] = ()
    """The namespaces whose Simulations are served (empty: ``config.namespace``)."""
    admission: AdmissionPolicy = field(
        default_factory=lambda: AdmissionPolicy(solvers=openfoam_applications())
    )
    """What the admin allows Simulations to ask for (host paths, case roots, solvers)."""
    namespace_limits: NamespaceLimits = field(default_factory=NamespaceLimits)
    """How many Simulations one namespace may have queued and running."""


def _cluster_millis(backend: NamespacedBackends, every_s: float = 30.0) -> Callable[[], int | None]:
    """What all schedulable nodes, Ready or not, can allocate, read at most every
    ``every_s`` (admission's fit check: a Simulation that fits once a lost node is back is
    held, not refused; None while the inventory cannot be read)."""
    last: list[tuple[float, int | None]] = []

    def read() -> int | None:
        now = time.monotonic()
        if not last or now - last[0][0] > every_s:
            try:
                found: int | None = backend.inventory().all_nodes_millis
            except BackendError:
                found = None
            last[:] = [(now, found)]
        return last[0][1]

    return read


REFUSED_S = 30.0
"""Leader election refused (401/403) for this long: the identity may not use leases."""


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class OperatorResult:
    status: str
    """idle (nothing left, with until_idle) | stopped"""
    adopted: int
    requeued: int
    finished: list[str]
    terms: int = 0
    """Stretches of leadership (more than one: the Lease was lost and taken again)."""
    multiplex_id: int | None = None
    plot: str | None = None


class _Display(StatusWriter):
    """Status, metrics and Events from the loop's view and the store's new events."""

    def __init__(self, queue: SimulationQueue, interval_s: float, metrics: OperatorMetrics,
                 store: Store, events: SimulationEvents) -> None:  # fmt: skip
        super().__init__(queue, interval_s)
        self.metrics, self.store, self.events = metrics, store, events
        self.multiplex_id: int | None = None
        self.last_event = 0

    def update(self, now_s: float, sims: Sequence[SimView]) -> None:
        super().update(now_s, sims)
        self.metrics.update(self.queue.names, sims)
        self.drain()

    def drain(self) -> None:
        if self.multiplex_id is None:
            return
        new = self.store.events(multiplex_id=self.multiplex_id, after_id=self.last_event)
        if new:
            self.last_event = new[-1].id
            self.metrics.count_events(new)
            self.events.add(new)
            self._resizes_held(new)

    def _resizes_held(self, new: Sequence[EventRow]) -> None:
        """A grow held within the quota (or refused by it) shows in the status too."""
        name_of = _name_of(self.queue)
        for e in new:
            quota = str(e.detail.get("code") or "") in QUOTA_CODES
            if e.kind in ("resize-capped", "resize-skipped", "resize-rejected") and quota:
                name = name_of(e)
                if name is not None:
                    self.resize_held(name, str(e.detail.get("reason") or "held for quota"))
            elif e.kind == "resize-held" and e.detail.get("code") == "node-full":
                name = name_of(e)
                if name is not None:  # its rank's node cannot hold the grow (issue 28)
                    self.resize_held(name, str(e.detail.get("reason") or ""), "NodeFull")
            elif e.kind == "resize":
                name = name_of(e)
                if name is not None:
                    self.resize_held(name, None)


@dataclass
class _Ctx:
    """What lives as long as the operator process (across terms)."""

    opts: OperatorOptions
    backend: NamespacedBackends
    store: Store
    queue: SimulationQueue
    display: _Display
    stop: threading.Event
    say: Callable[[str], None]
    t0: float
    multiplex_id: int = 0
    capacity_millis: int = 0
    finished: list[str] = field(default_factory=list)


def _name_of(queue: SimulationQueue) -> Callable[[EventRow], str | None]:
    def name_of(e: EventRow) -> str | None:
        qid = e.detail.get("queue_id")
        if isinstance(qid, int) and qid in queue.names:
            return queue.names[qid]
        if e.run_id is not None:
            for q, rid in list(queue.run_ids.items()):
                if rid == e.run_id:
                    return queue.names.get(q)
        sim = e.detail.get("sim")
        return queue.sim_names.get(sim) if isinstance(sim, str) else None

    return name_of


def run_operator(
    opts: OperatorOptions,
    *,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = lambda s: None,
) -> OperatorResult:
    stop = stop or threading.Event()
    identity = opts.identity or default_identity()
    opts = replace(opts, identity=identity, config=replace(opts.config, detach=True))
    if not opts.admission.solvers:
        raise BackendError(
            "no solver is allowed: no OpenFOAM application (*Foam) was found in /usr/bin; "
            "name the solvers Simulations may run with --solver NAME"
        )
    namespace = opts.config.namespace
    tenancy = Tenancy(opts.namespaces or (namespace,), str(opts.runs_root), opts.volume)
    tenancy.check(opts.admission)
    backend = connect_namespaces(opts.config, tenancy.namespaces)
    api = backend.primary.api  # one client for the Simulations and the Lease (its counter)
    if not isinstance(api, ClientKubeApi):  # (connect_namespaces makes client APIs)
        raise BackendError("the operator needs the Kubernetes client")
    sims = SimulationApi(api, tenancy.namespaces)
    sims.cache = SimulationCache(backend.primary.cache, tenancy.namespaces)
    try:
        sims.cache.start()
    except ApiError as exc:
        backend.close()
        raise BackendError(
            f"cannot list simulations.{crd.GROUP} in namespaces {', '.join(tenancy.namespaces)}: "
            f"{_first_line(exc)}; is the CRD installed (kubectl apply -f deploy/base/crd.yaml) "
            "and may this identity use it there (deploy/base/backend.yaml; serving several "
            "namespaces, the Role of deploy/tenants in each)?"
        ) from exc
    sims.cache.on_change(backend.notify)  # a Simulation created or changed wakes the loop
    metrics = OperatorMetrics(api.requests)
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
    store = Store(opts.db_path)
    queue = SimulationQueue(
        sims, store, identity, admission=opts.admission,
        cluster_millis=_cluster_millis(backend), placement=backend.placement,
        limits=opts.namespace_limits, status_interval_s=opts.status_interval_s,
        tenancy=tenancy,
    )  # fmt: skip
    events = SimulationEvents(
        _post_event(backend), tenancy.namespaces[0], identity,
        name_of=_name_of(queue), uid_of=queue.uids.get,
    )  # fmt: skip
    events.start()
    # every tick's view goes to the queue, which writes it at most every status_interval_s
    display = _Display(queue, 0.0, metrics, store, events)
    ctx = _Ctx(opts, backend, store, queue, display, stop, say, backend.clock())
    result = OperatorResult("stopped", 0, 0, [])
    try:
        while not stop.is_set():
            lease = Lease(api, LeaseTerms(opts.lease_name, namespace, identity, opts.lease_s,
                                          opts.renew_s, opts.retry_s))  # fmt: skip
            lease.start()
            followed = _follow(lease, ctx)
            if followed == "stopped":
                break
            if followed == "retry":
                stop.wait(opts.retry_s)
                continue
            result.terms += 1
            say(f"{identity}: leading" + (f" (term {result.terms})" if result.terms > 1 else ""))
            if not ctx.multiplex_id:
                _start_session(ctx)
                result.multiplex_id = ctx.multiplex_id
            status, adopted, requeued = _term(ctx, lease)
            result.adopted += adopted
            result.requeued += requeued
            queue.end_term()
            left = backend.forget_all()
            if status in ("idle", "stopped"):
                result.status = status
                lease.release()
                break
            why = f" ({lease_error})" if (lease_error := _lease_error(lease)) else ""
            say(f"{identity}: lost the lease{why}; {len(left)} simulation(s) left running; "
                "following again")  # fmt: skip
    finally:
        stop.set()
        display.drain()
        events.stop()
        result.finished = list(ctx.finished)
        if ctx.multiplex_id:
            store.finish_multiplex(ctx.multiplex_id, result.status, {
                "adopted": result.adopted, "requeued": result.requeued,
                "finished": result.finished, "terms": result.terms,
            })  # fmt: skip
            if opts.plot is not None:
                result.plot = _plot(ctx, opts.plot)
        backend.close()
    return result


def _post_event(backend: NamespacedBackends) -> Callable[[Obj], object]:
    """Posts an Event in its Simulation's namespace, with the rights held there."""

    def post(body: Obj) -> object:
        ns = str(body["metadata"].get("namespace") or backend.namespaces[0])
        return backend.backend_of(ns).api.create("events", body)

    return post


def _lease_error(lease: Lease) -> str:
    return lease.last_error[1] if lease.last_error else ""


def _follow(lease: Lease, ctx: _Ctx) -> str:
    """Wait until this operator leads: leading | stopped | retry (the elector ended without
    leading; start another)."""
    ns, name = ctx.opts.config.namespace, ctx.opts.lease_name
    ctx.say(f"{ctx.opts.identity}: waiting for the lease {ns}/{name}")
    while not lease.leading.wait(0.5):
        if ctx.stop.is_set():
            return "stopped"
        refused = lease.refused_since
        if refused is not None and time.monotonic() - refused > REFUSED_S and lease.last_error:
            raise BackendError(
                f"leader election on Lease {ns}/{name} is refused ({lease.last_error[1]}); "
                "may this identity use leases (deploy/base/backend.yaml)?"
            )
        if lease.lost.is_set() and not lease.leading.is_set():
            return "retry"
    return "leading"


def _start_session(ctx: _Ctx) -> None:
    """The store's record of this operator's session, once it first leads."""
    opts = ctx.opts
    capacity = opts.capacity_millis
    while capacity is None and not ctx.stop.is_set():
        try:
            capacity = ctx.backend.inventory().allocatable_millis
        except BackendError as exc:
            ctx.say(f"cannot read the capacity yet: {exc}")
            ctx.stop.wait(2.0)
    ctx.capacity_millis = capacity or 0
    ctx.multiplex_id = ctx.store.start_multiplex(
        ctx.capacity_millis, opts.controller.max_concurrent, opts.wait_mode,
        "kubernetes-operator",
    )  # fmt: skip
    ctx.display.multiplex_id = ctx.multiplex_id


def _settings(ctx: _Ctx) -> LoopSettings:
    opts = ctx.opts
    return LoopSettings(
        runs_root=opts.runs_root, controller=replace(opts.controller, launch_must_fit=True),
        wait_mode=opts.wait_mode,
        capacity_millis=ctx.capacity_millis, multiplex_id=ctx.multiplex_id,
        label=f"operator-{ctx.multiplex_id}",
        extra={"multiplex_id": ctx.multiplex_id, "operator": opts.identity},
        # each job carries its namespace's run directories and volume (`Tenancy`)
        image=opts.config.image, volume=None, leave_running=True,
        solvers=opts.admission.solvers, confine_staging=True, sim_labels=dict(OPERATOR_LABEL),
    )  # fmt: skip


def _term(ctx: _Ctx, lease: Lease) -> tuple[str, int, int]:
    """Lead until the Lease is lost, the operator is stopped or (until_idle) nothing is
    left. Returns (idle | stopped | lost-lease, adopted, requeued)."""
    term_stop = threading.Event()

    def watch_lease() -> None:
        while not (ctx.stop.is_set() or lease.lost.is_set() or term_stop.is_set()):
            time.sleep(0.2)
        term_stop.set()
        ctx.backend.notify()

    threading.Thread(target=watch_lease, daemon=True, name="term").start()
    adopted = requeued = 0
    status = "lost-lease"
    try:
        while not term_stop.is_set():
            loop = ControlLoop(ctx.backend, ctx.store, ctx.queue, _settings(ctx),
                               display=ctx.display, stop=term_stop, t0=ctx.t0)  # fmt: skip
            n = _adopt_all(ctx, loop, term_stop)
            if n is None:
                break
            adopted += n
            requeued += _requeue_unlaunched(ctx, term_stop)
            try:
                while not term_stop.is_set():
                    result = loop.run()
                    ctx.display.drain()  # what the last tick recorded: Events, metrics
                    ctx.finished += [ctx.queue.names.get(o.queue_id, "?") for o in result.outcomes]
                    if term_stop.is_set():
                        break
                    if ctx.opts.until_idle and ctx.queue.idle():
                        status = "idle"
                        return status, adopted, requeued
                    ctx.backend.wait(5.0)  # a watch event wakes it at once
                    loop = ControlLoop(ctx.backend, ctx.store, ctx.queue, _settings(ctx),
                                       display=ctx.display, stop=term_stop, t0=ctx.t0)  # fmt: skip
            except BackendError as exc:
                # Something the loop could not ride out: it left the launched simulations
                # running; follow them again from the cluster's state.
                ctx.say(f"control loop: {exc}; adopting the running simulations again")
                ctx.backend.forget_all()
                term_stop.wait(2.0)
    finally:
        term_stop.set()
        if ctx.stop.is_set():
            status = "stopped"
    return status, adopted, requeued


def _adopt_all(ctx: _Ctx, loop: ControlLoop, term_stop: threading.Event) -> int | None:
    """Adopt every Running Simulation with a sim id (retried while the apiserver does not
    answer); None if the term ended first."""
    queue = ctx.queue
    found: list[Adopted] | None = None
    while found is None:
        found = queue.running_for_adoption()
        if found is None and term_stop.wait(2.0):
            return None
    n = 0
    for a in found:
        name = queue.names[a.job.queue_id]
        run = _finished_run(ctx.store, a.run_id)
        if run is not None:  # it ended under this process; only its status was not written
            queue.finished(a.job, run)
            continue
        while not term_stop.is_set():
            try:
                loop.adopt(a)
            except UnknownSimulation as exc:
                queue.fail(name, FailureCode.LOST_ON_RESTART, f"could not be adopted: {exc}")
                ctx.say(f"{name}: could not be adopted ({exc}); failed")
            except BackendError as exc:  # the apiserver did not answer: try again
                ctx.say(f"{name}: adoption waits ({exc})")
                term_stop.wait(2.0)
                continue
            else:
                n += 1
                ctx.say(f"adopted {name} (simulation {a.sim_id})")
            break
    if not term_stop.is_set():
        _discard_orphans(ctx, {a.sim_id for a in found})
    return None if term_stop.is_set() else n


OPERATOR_LABEL = {"rankpack.dev/launched-by": "operator"}
"""On every object of the simulations operators launch (`rankpack run` launches carry none)."""


def _discard_orphans(ctx: _Ctx, held: set[str]) -> None:
    """Simulations an operator launched whose Simulation is gone (deleted while no
    operator ran): nobody will ever follow them, and their pods hold CPU; stopped and
    deleted. Simulations launched otherwise (`rankpack run`) are never touched."""
    try:
        refs = ctx.backend.list()
    except BackendError as exc:
        ctx.say(f"cannot list the simulations to find orphans ({_first_line(exc)})")
        return
    for ref in refs:
        ours = all(ref.labels.get(k) == v for k, v in OPERATOR_LABEL.items())
        if ref.sim_id and ours and ref.sim_id not in held:
            ctx.say(f"simulation {ref.sim_id} has no Simulation any more: stopped and deleted")
            ctx.backend.discard(ref.sim_id)


def _finished_run(store: Store, run_id: int | None) -> str | None:
    """The status of run ``run_id`` if this store has it finished (completed, failed)."""
    if run_id is None:
        return None
    try:
        status = store.get_run(run_id).status
    except UserError:
        return None
    return status if status in ("completed", "failed") else None


def _requeue_unlaunched(ctx: _Ctx, term_stop: threading.Event) -> int:
    names: list[str] | None = None
    while names is None and not term_stop.is_set():
        names = ctx.queue.claimed_not_launched()
        if names is None:
            term_stop.wait(2.0)
    for name in names or []:
        ctx.queue.requeue(name, "its operator stopped between claim and launch")
    return len(names or [])


def _plot(ctx: _Ctx, path: Path) -> str | None:
    from rankpack.operator.plot import plot_session

    try:
        title = f"rankpack operator {ctx.opts.identity}: session {ctx.multiplex_id}"
        q = ctx.queue
        names = {run: q.names[qid] for qid, run in q.run_ids.items() if qid in q.names}
        n = plot_session(ctx.store, ctx.multiplex_id, path, title, names)
    except (OSError, ValueError) as exc:
        ctx.say(f"cannot write the timeline {path}: {exc}")
        return None
    ctx.say(f"timeline of {n} run(s): {path}")
    return str(path)


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [""])[0][:200]
