"""`rankpack operator`: the one control loop, on the Simulations of the served namespaces.

Start-up: take the Lease (leader election: only the holder acts), open the store (a standby
that follows never opens it: the leader may be writing it, from another node of a shared
volume), then adopt every Running Simulation an earlier operator launched (its mpirun
outlives the operator: the backend is configured with ``detach``), requeue the ones it
claimed but never launched (`adoption`), and run the control loop on the queue of
Simulations (`queue`), its view shown by `display.OperatorDisplay`. The Simulations are read
from a cache (`simcache`: listed once, then watched from their resourceVersion; the watch
resumes after the apiserver went away), whose changes wake the loop. Each served namespace
has its own backend and Role (`rankpack.operator.tenancy`); the Lease is in the operator's
own namespace (``config.namespace``).

A *term* is one stretch of leadership. The apiserver going away is not fatal: for a few
seconds the loop carries on with what it knows (status patches and Events wait, resizes
that fail are retried with back-off, nothing new is launched); once the Lease cannot be
renewed (``renew_s``) the term ends — the simulations keep running, nothing is stopped, the
store is closed — and the operator follows again: when it (or another operator) takes the
Lease, that leader adopts them from the cluster's state, exactly as after a crash.
SIGTERM/Ctrl-C end the operator and leave the simulations running for the next leader.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rankpack.backend.kubernetes.api.client import ClientKubeApi
from rankpack.backend.kubernetes.api.config import DEV_IMAGE, KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import ApiError, Obj
from rankpack.backend.kubernetes.connect import connect_namespaces
from rankpack.backend.kubernetes.tenants import NamespacedBackends
from rankpack.backend.protocol import BackendError
from rankpack.controller.decision import ControllerSettings
from rankpack.controller.loop import ControlLoop
from rankpack.controller.tracked import LoopSettings
from rankpack.operator import crd
from rankpack.operator.admission import (
    AdmissionPolicy,
    NamespaceLimits,
    openfoam_applications,
)
from rankpack.operator.adoption import OPERATOR_LABEL, Adoption
from rankpack.operator.display import OperatorDisplay
from rankpack.operator.events import SimulationEvents
from rankpack.operator.lease import Lease, LeaseTerms
from rankpack.operator.metrics import OperatorMetrics
from rankpack.operator.queue import SimulationQueue
from rankpack.operator.simapi import SimulationApi
from rankpack.operator.simcache import SimulationCache
from rankpack.operator.tenancy import Tenancy
from rankpack.store import Store

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
    case_scan: bool = True
    """Refuse case code the scanner finds before staging (defence in depth behind the
    staging pod; ``--case-scan off``)."""


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


@dataclass
class _Ctx:
    """What lives as long as the operator process (across terms)."""

    opts: OperatorOptions
    backend: NamespacedBackends
    api: ClientKubeApi
    """The one client for the Simulations and the Lease (its request counter)."""
    queue: SimulationQueue
    events: SimulationEvents
    display: OperatorDisplay
    stop: threading.Event
    say: Callable[[str], None]
    t0: float
    store: Store | None = None
    """Open while this operator leads (`_open_store`), closed when a term is lost."""
    multiplex_id: int = 0
    capacity_millis: int = 0
    finished: list[str] = field(default_factory=list)


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
    tenancy = Tenancy(opts.namespaces or (opts.config.namespace,), str(opts.runs_root),
                      opts.volume)  # fmt: skip
    tenancy.check(opts.admission)
    if opts.config.image == DEV_IMAGE:
        say(
            f"warning: the image {DEV_IMAGE} holds no rankpack: cases are staged in this "
            "process (scanned), not in staging pods; give --image for a sandbox"
        )
    else:  # each case is staged in its own pod, which resolves its path: no look here
        opts = replace(opts, admission=replace(opts.admission, resolve_links=False))
    backend = connect_namespaces(opts.config, tenancy.namespaces)
    ctx = _start(opts, backend, tenancy, stop, say)
    result = OperatorResult("stopped", 0, 0, [])
    try:
        _lead(ctx, result)
    finally:
        _close(ctx, result)
    return result


def _start(
    opts: OperatorOptions,
    backend: NamespacedBackends,
    tenancy: Tenancy,
    stop: threading.Event,
    say: Callable[[str], None],
) -> _Ctx:
    """What the operator holds across terms: its Simulations (from the cache), metrics,
    queue, Events and display (the backend is closed if one cannot be had); not the
    store, which only a leader opens."""
    api = backend.primary.api  # one client for the Simulations and the Lease (its counter)
    if not isinstance(api, ClientKubeApi):  # (connect_namespaces makes client APIs)
        raise BackendError("the operator needs the Kubernetes client")
    sims = _simulations(api, backend, tenancy)
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
    queue = SimulationQueue(
        sims, opts.identity, admission=opts.admission,
        cluster_millis=_cluster_millis(backend), placement=backend.placement,
        limits=opts.namespace_limits, status_interval_s=opts.status_interval_s,
        tenancy=tenancy,
    )  # fmt: skip
    events = SimulationEvents(
        _post_event(backend), tenancy.namespaces[0], opts.identity,
        name_of=queue.index.key_of_event, uid_of=queue.index.uids.get,
    )  # fmt: skip
    events.start()
    # every tick's view goes to the queue, which writes it at most every status_interval_s
    display = OperatorDisplay(queue, 0.0, metrics, events)
    return _Ctx(opts, backend, api, queue, events, display, stop, say, backend.clock())


def _simulations(
    api: ClientKubeApi, backend: NamespacedBackends, tenancy: Tenancy
) -> SimulationApi:
    """The served namespaces' Simulations, read from a cache whose changes wake the loop."""
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
    return sims


def _lead(ctx: _Ctx, result: OperatorResult) -> None:
    """Follow, then lead, term after term, until stopped (or idle, with until_idle)."""
    opts, identity = ctx.opts, ctx.opts.identity
    while not ctx.stop.is_set():
        lease = Lease(ctx.api, LeaseTerms(opts.lease_name, opts.config.namespace, identity,
                                          opts.lease_s, opts.renew_s, opts.retry_s))  # fmt: skip
        lease.start()
        followed = _follow(lease, ctx)
        if followed == "stopped":
            break
        if followed == "retry":
            ctx.stop.wait(opts.retry_s)
            continue
        result.terms += 1
        ctx.say(f"{identity}: leading" + (f" (term {result.terms})" if result.terms > 1 else ""))
        store = _open_store(ctx)
        if not ctx.multiplex_id:
            _start_session(ctx, store)
            result.multiplex_id = ctx.multiplex_id
        status, adopted, requeued = _term(ctx, lease, store)
        result.adopted += adopted
        result.requeued += requeued
        ctx.queue.end_term()
        left = ctx.backend.forget_all()
        if status in ("idle", "stopped"):
            result.status = status
            lease.release()
            break  # (the store stays open for `_close`: this operator still led)
        ctx.display.drain()
        _close_store(ctx)
        why = f" ({lease_error})" if (lease_error := _lease_error(lease)) else ""
        ctx.say(f"{identity}: lost the lease{why}; {len(left)} simulation(s) left running; "
                "following again")  # fmt: skip


def _close(ctx: _Ctx, result: OperatorResult) -> None:
    """The operator ends: its last Events, its session's record and timeline."""
    ctx.stop.set()
    ctx.display.drain()
    ctx.events.stop()
    result.finished = list(ctx.finished)
    if ctx.multiplex_id and ctx.store is not None:  # (a standby's session: the leader's now)
        ctx.store.finish_multiplex(ctx.multiplex_id, result.status, {
            "adopted": result.adopted, "requeued": result.requeued,
            "finished": result.finished, "terms": result.terms,
        })  # fmt: skip
        if ctx.opts.plot is not None:
            result.plot = _plot(ctx, ctx.store, ctx.opts.plot)
    _close_store(ctx)
    ctx.backend.close()


def _open_store(ctx: _Ctx) -> Store:
    """The store, opened now that this operator leads (never by a standby)."""
    store = Store(ctx.opts.db_path)
    ctx.store = ctx.display.store = store
    return store


def _close_store(ctx: _Ctx) -> None:
    if ctx.store is not None:
        ctx.store.close()
    ctx.store = ctx.display.store = None


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


def _start_session(ctx: _Ctx, store: Store) -> None:
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
    ctx.multiplex_id = store.start_multiplex(
        ctx.capacity_millis, opts.controller.max_concurrent, opts.wait_mode,
        "kubernetes-operator",
    )  # fmt: skip
    ctx.display.multiplex_id = ctx.multiplex_id


def _settings(ctx: _Ctx) -> LoopSettings:
    opts = ctx.opts
    return LoopSettings(
        runs_root=opts.runs_root,
        controller=replace(opts.controller, launch_must_fit=True, launch_staged_only=True),
        wait_mode=opts.wait_mode,
        capacity_millis=ctx.capacity_millis, multiplex_id=ctx.multiplex_id,
        label=f"operator-{ctx.multiplex_id}",
        extra={"multiplex_id": ctx.multiplex_id, "operator": opts.identity},
        # each job carries its namespace's run directories and volume (`Tenancy`)
        image=opts.config.image, volume=None, leave_running=True,
        solvers=opts.admission.solvers, image_solvers=opts.admission.image_solvers,
        confine_staging=True, case_scan=opts.case_scan,
        sim_labels=dict(OPERATOR_LABEL),
    )  # fmt: skip


def _term(ctx: _Ctx, lease: Lease, store: Store) -> tuple[str, int, int]:
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
    adoption = Adoption(ctx.queue, store, ctx.backend, ctx.say)
    try:
        while not term_stop.is_set():
            loop = ControlLoop(ctx.backend, store, ctx.queue, _settings(ctx),
                               display=ctx.display, stop=term_stop, t0=ctx.t0)  # fmt: skip
            n = adoption.adopt_all(loop, term_stop)
            if n is None:
                break
            adopted += n
            requeued += adoption.requeue_unlaunched(term_stop)
            try:
                while not term_stop.is_set():
                    result = loop.run()
                    ctx.display.drain()  # what the last tick recorded: Events, metrics
                    ctx.finished += [ctx.queue.index.names.get(o.queue_id, "?")
                                     for o in result.outcomes]  # fmt: skip
                    if term_stop.is_set():
                        break
                    if ctx.opts.until_idle and ctx.queue.idle():
                        status = "idle"
                        return status, adopted, requeued
                    ctx.backend.wait(5.0)  # a watch event wakes it at once
                    loop = ControlLoop(ctx.backend, store, ctx.queue, _settings(ctx),
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


def _plot(ctx: _Ctx, store: Store, path: Path) -> str | None:
    from rankpack.operator.plot import plot_session

    try:
        title = f"rankpack operator {ctx.opts.identity}: session {ctx.multiplex_id}"
        n = plot_session(store, ctx.multiplex_id, path, title, ctx.queue.index.run_keys())
    except (OSError, ValueError) as exc:
        ctx.say(f"cannot write the timeline {path}: {exc}")
        return None
    ctx.say(f"timeline of {n} run(s): {path}")
    return str(path)


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [""])[0][:200]
