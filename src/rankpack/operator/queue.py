"""The control loop's job source on Kubernetes: the Simulations of the served namespaces.

A Simulation is admitted when a listing first shows it (`rankpack.operator.arrivals`:
``Queued``, or ``Failed`` with the reason); the ``Queued`` ones are pending, oldest first.
Claiming one replaces its status with ``Running`` under its resourceVersion, so two
operators can never both claim it (the apiserver answers 409 to the second). Its launch
and its end (``Succeeded``/``Failed`` with the run's result, which `finished` is handed)
are written into its status (`rankpack.operator.transitions` builds each change,
`rankpack.operator.outbox.StatusOutbox` writes it, coalesced); the loop's progress goes
through the same outbox (`rankpack.operator.status.StatusWriter`). A launch refused for
quota, or a run a lost node cut short, goes back ``Queued`` (`requeued`); a hold says why
in its status's reason and message; a namespace that runs as many as allowed
(`NamespaceLimits.running_hold`) holds its next one. Everything the operator needs to follow
a running Simulation after a restart (sim id, run id, staged case, start time) is in its
status, so `rankpack.operator.adoption` can hand them to `ControlLoop.adopt`.

The apiserver may go away at any moment (restarted, overloaded): no method here raises for
that. A status patch that fails is kept and written when the apiserver answers again
(`flush`, every tick); `pending` answers no new work while it cannot list, and `idle` is
only true on a fresh, successful listing. The Simulations are read from the operator's cache
(`SimulationApi.cache`, `simcache`: listed once, then watched), not listed every tick.

Serving several namespaces (`rankpack.operator.tenancy`), a Simulation is known by its key,
``namespace/name`` (`rankpack.operator.simapi.simulation_key`), and its job carries its
namespace, its namespace's run directories and volume.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rankpack.backend.kubernetes.api.kubeapi import ApiError, Conflict, NotFound
from rankpack.case.staging import StagedCase
from rankpack.controller.jobs import Job
from rankpack.core.failures import Failure, FailureCode
from rankpack.core.results import RunResult
from rankpack.errors import UserError
from rankpack.operator import crd, transitions
from rankpack.operator.admission import MAX_RUNNING_REASON, AdmissionPolicy, NamespaceLimits
from rankpack.operator.arrivals import Arrivals
from rankpack.operator.codec import resume_from_json
from rankpack.operator.index import SimulationIndex
from rankpack.operator.listing import Listing
from rankpack.operator.outbox import StatusOutbox
from rankpack.operator.simapi import SimulationApi, first_line
from rankpack.operator.tenancy import Tenancy
from rankpack.plan.submission import Submission

Obj = dict[str, Any]


class SimulationQueue:
    """`JobSource` over the Simulations of the served namespaces (see the module doc)."""

    def __init__(
        self,
        api: SimulationApi,
        identity: str,
        *,
        on_event: Callable[[str, Obj], None] | None = None,
        admission: AdmissionPolicy | None = None,
        cluster_millis: Callable[[], int | None] = lambda: None,
        placement: Callable[[], dict[str, str]] = dict,
        limits: NamespaceLimits | None = None,
        status_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        tenancy: Tenancy | None = None,
    ) -> None:
        self.api = api
        self.identity = identity
        self.tenancy = tenancy
        """The served namespaces' run directories, volumes and case roots (None: the loop's
        own, one namespace, as before)."""
        self.limits = limits or NamespaceLimits()
        """How many Simulations one namespace may have queued and running."""
        self.placement = placement
        """The backend's facts (`Backend.placement`): where usage and duty cycles come from
        (``usage``: node-agent, node-local) and how ranks are started (``launcher``), written
        into each Simulation's status at launch."""
        self.on_event = on_event or (lambda name, detail: None)
        self.index = SimulationIndex()
        self.outbox = StatusOutbox(api, status_interval_s, clock)
        """Every status write (at most one patch per Simulation per ``status_interval_s``
        but phase changes and launches)."""
        self.arrivals = Arrivals(self.outbox, admission=admission, cluster_millis=cluster_millis,
                                 limits=self.limits, tenancy=tenancy)  # fmt: skip
        self.holds: dict[str, tuple[str, str]] = {}
        """Simulation key -> the hold (reason, message) last written into its status."""
        self.api_error: str | None = None
        """Why the last listing or claim failed (None: it succeeded)."""
        self.uncertain: set[str] = set()
        """Claims whose answer was lost (the apiserver went away): checked in `flush`."""
        self.listed: dict[str, str] | None = None
        """Key -> uid of every Simulation in the last listing that succeeded."""

    # -- reading the Simulations ---------------------------------------------------------------

    def listing(self) -> Listing | None:
        """The Simulations, those seen for the first time admitted (`Arrivals`), or None if
        the apiserver did not answer."""
        try:
            objs = self.api.list()
        except ApiError as exc:
            self.api_error = first_line(exc)
            return None
        self.api_error = None
        several = self.tenancy is not None and self.tenancy.several
        listing = Listing.of(objs, several, self.api.namespace)
        for item in listing.items:
            if item.uid:
                self.index.uids[item.key] = item.uid
        self.listed = listing.uids()
        return self.arrivals.admit(listing)

    def idle(self) -> bool:
        """Nothing queued or running, on a listing that succeeded."""
        listing = self.listing()
        if listing is None:
            return False
        return not any(i.phase in (None, "Queued", *crd.CLAIMED) for i in listing.items)

    def pending(self) -> list[Job]:
        """The Simulations waiting to be launched, oldest first; one whose namespace runs as
        many as allowed waits ``Queued`` (``MaxRunningPerNamespace``) and is not handed to
        the loop."""
        jobs: list[Job] = []
        self.flush()
        listing = self.listing()
        if listing is None:
            return jobs  # no new work while the apiserver does not answer
        running = listing.counts(*crd.CLAIMED)  # a starting one counts as running
        for item in listing.oldest_first():
            if item.phase != "Queued":
                continue
            unwritten = self.outbox.unwritten(item.key)
            if unwritten is not None and unwritten.get("phase", "Queued") != "Queued":
                continue  # a change out of the queue is not written yet: not pending
            # (an unwritten "Queued" keeps its place: skipping it let a later Simulation
            # become the head while the apiserver was slow to answer)
            try:
                sub = crd.submission_of(item.obj)
            except UserError as exc:
                self.fail(item.key, FailureCode.INVALID_SPEC, str(exc))
                continue
            hold = self.limits.running_hold(item.namespace, running.get(item.namespace, 0))
            if hold:
                self._hold(item.key, MAX_RUNNING_REASON, hold)
                continue
            job = self.job(self.index.queue_id(item.key), sub, item.namespace)
            resume = resume_from_json(item.status.get("resume"))
            jobs.append(job if resume is None else replace(job, resume=resume))
        return jobs

    def job(self, queue_id: int, sub: Submission, namespace: str) -> Job:
        """The loop's job: in its namespace, with that namespace's run directories and
        volume (`Tenancy`)."""
        t = self.tenancy
        root = self.arrivals.case_root(namespace, sub.case)
        if t is None:
            return Job(queue_id, sub, case_root=root)
        return Job(queue_id, sub, namespace=namespace, runs_root=t.runs_root_of(namespace),
                   volume=t.volume_of(namespace), case_root=root)  # fmt: skip

    # -- JobSource -----------------------------------------------------------------------------

    def claim(self, job: Job) -> bool:
        key = self.index.names[job.queue_id]
        try:
            obj = self.api.get(key)
        except ApiError:
            return False
        status = dict(obj.get("status") or {})
        if status.get("phase") not in (None, "Queued"):
            return False
        self.outbox.seed(key, status.get("conditions") or [])
        conditions = self.outbox.set_conditions(key, *transitions.claimed(self.identity))
        status.pop("reason", None)  # why it waited: over once it is claimed
        status.pop("message", None)
        self.holds.pop(key, None)
        status.update(phase="Starting", operator=self.identity, conditions=conditions)
        obj["status"] = status
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        self.outbox.superseded(key)  # the claim writes the whole status: a "Queued" is stale
        try:
            self.api.replace_status(obj)
        except Conflict:  # another operator claimed it first
            self.api_error = None
            return False
        except ApiError as exc:
            # the apiserver went away: not claimed (or its answer was lost: `flush` checks),
            # it stays Queued and is tried again later
            self.api_error = first_line(exc)
            self.uncertain.add(key)
            return False
        self.uncertain.discard(key)
        self.index.hold(job.queue_id, uid)
        self.outbox.wrote(key)
        return True

    def started(self, job: Job, run_id: int, sim_id: str, staged: StagedCase) -> None:
        self.index.launched(job.queue_id, run_id, sim_id)
        key = self.index.names[job.queue_id]
        self.outbox.patch(key, *transitions.launched(job, run_id, sim_id, staged, self.placement()))

    def finished(
        self,
        job: Job,
        status: str,
        message: str = "",
        failure: FailureCode | None = None,
        result: RunResult | None = None,
    ) -> None:
        """Its end in its status: ``Succeeded``, or ``Failed`` with the code as the status's
        and the conditions' reason (``failure`` when it ended before it had a run, else the
        run's own code, ``result.failure``), with the run's figures from ``result``."""
        key = self.index.key(job.queue_id)
        if key is None:
            return
        self.index.release(job.queue_id)
        if job.queue_id in self.index.gone:  # its Simulation was deleted: nothing to write
            self.forget(job.queue_id)
            return
        if status == "queued":  # interrupted before launch: back to the queue
            self.requeue(key, "the operator stopped before launch")
            return
        if status == "interrupted":
            return  # stopped with the operator: it is still running and will be adopted
        change = transitions.ended(status, message, failure, result)
        self.outbox.patch(key, *change)
        self.on_event("finished", {"simulation": key, "phase": change.fields["phase"]})

    def heartbeat(self, jobs: Sequence[Job]) -> None:
        pass  # the Lease is the operator's heartbeat; status carries the progress

    def held(self, job: Job, code: str, reason: str) -> None:
        """The head of the queue waits: its status's reason and message and its Queued
        condition say why (``QuotaExceeded`` when the namespace's ResourceQuota leaves no
        room)."""
        key = self.index.key(job.queue_id)
        if key is None:
            return
        self._hold(key, transitions.HOLD_REASONS.get(code, "Waiting"), reason)

    def _hold(self, key: str, why: str, message: str) -> None:
        """Its status says why it waits (written when that changes)."""
        if self.holds.get(key) == (why, message):
            return
        self.holds[key] = (why, message)
        self.outbox.patch(key, *transitions.held(why, message))

    def requeued(self, job: Job, why: Failure) -> None:
        """Its launch was refused for a reason that passes (the namespace's quota, taken
        between plan and create; nothing of it is left), or a lost node cut its run short
        (``NodeLost``: its ``resume`` keeps the staged case and the iterations done): back
        to ``Queued`` with the code as its reason, its launch forgotten (sim id, run,
        staged case), to be launched again."""
        key = self.index.key(job.queue_id)
        if key is None:
            return
        self.index.unlaunched(job.queue_id)  # back in the queue: not this loop's any more
        self.holds.pop(key, None)
        self.outbox.patch(key, *transitions.requeued(job, why))
        self.on_event("requeued", {"simulation": key, "reason": str(why.code)})

    def withdrawn(self) -> set[int]:
        """The Simulations this operator claimed that are gone from the last listing, or
        were deleted and created again under the same name (another uid): their runs are
        stopped and released by the loop (`kubectl delete simulation` stops a run)."""
        if self.listed is None:
            return set()
        return self.index.withdrawn(self.listed)

    def forget(self, queue_id: int) -> None:
        """A withdrawn job: nothing of it is written back (its Simulation is gone)."""
        key = self.index.forget(queue_id)
        if key is not None:
            self.outbox.forget(key)

    # -- status changes outside the loop -------------------------------------------------------

    def requeue(self, key: str, reason: str) -> None:
        """Claimed and never launched: back to ``Queued``."""
        self.outbox.patch(key, *transitions.unclaimed(reason))

    def fail(self, key: str, code: FailureCode, message: str) -> None:
        """End it ``Failed`` without a run (refused, invalid, lost): ``code`` is the status's
        and the conditions' reason."""
        self.outbox.patch(key, *transitions.failed(code, message))

    def flush(self) -> bool:
        """Write the status patches that wait (`StatusOutbox.flush`); False if the apiserver
        did not answer. A claim whose answer was lost and that did take effect (Starting,
        ours, never launched) goes back to the queue first."""
        for key in sorted(self.uncertain):
            try:
                st = self.api.get(key).get("status") or {}
            except NotFound:
                st = {}
            except ApiError:
                return False
            self.uncertain.discard(key)
            ours = st.get("phase") in crd.CLAIMED and st.get("operator") == self.identity
            if ours and not st.get("simId"):
                self.requeue(key, "its claim's answer was lost; back to the queue")
        return self.outbox.flush()

    def end_term(self) -> None:
        """This operator stopped leading: forget what it had not written but a final phase
        (`StatusOutbox.keep_final_phases`) and the claims it was unsure of."""
        self.outbox.keep_final_phases()
        self.uncertain.clear()
