"""The control loop's job source on Kubernetes: the Simulations of the served namespaces.

A Simulation with no phase (just created) or phase ``Queued`` is pending, oldest first.
Claiming one replaces its status with ``Running`` under its resourceVersion, so two
operators can never both claim it (the apiserver answers 409 to the second). The loop's
progress reaches each Simulation's status (`rankpack.operator.status.StatusWriter`, at most
every ``interval_s``), its end sets ``Succeeded``/``Failed`` with the run's result. A
launch refused for quota hands it back ``Queued`` (`requeued`); a hold says why in its
status's reason and message; per-namespace limits (`NamespaceLimits`) refuse or hold it.
Everything the operator needs to follow a running Simulation after a restart (sim id, run
id, staged case, start time) is in its status, so `running_for_adoption` can hand them to
`ControlLoop.adopt`.

The apiserver may go away at any moment (restarted, overloaded): no method here raises for
that. A status patch that fails is kept (merged per Simulation, last write wins per field)
and written when the apiserver answers again (`flush`, every tick); `pending` answers no
new work while it cannot list, and `idle` is only true on a fresh, successful listing.

Status writes are coalesced (issue 29): a change of phase or a launch (`URGENT`) is written
at once, with whatever else waits for that Simulation; anything else (progress, holds,
conditions) at most once per Simulation per ``status_interval_s`` (merged meanwhile and
written by `flush`). The Simulations are read from the operator's cache (`SimulationApi.cache`,
`simcache`: listed once, then watched), not listed every tick.

Serving several namespaces (`rankpack.operator.tenancy`), a Simulation is known by its key,
``namespace/name`` (client-go's cache key; one namespace: its name alone), and its job
carries its namespace, its namespace's run directories and volume, and is admitted against
its namespace's case roots.
"""

from __future__ import annotations

import builtins
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankpack.backend.kubernetes.api.client import ClientKubeApi
from rankpack.backend.kubernetes.api.kubeapi import ApiError, Conflict, NotFound
from rankpack.case.staging import StagedCase
from rankpack.controller.jobs import Resume
from rankpack.controller.loop import Adopted, Job
from rankpack.core.failures import Failure, FailureCode
from rankpack.core.results import progress_text
from rankpack.errors import UserError
from rankpack.operator import crd
from rankpack.operator.admission import (
    MAX_RUNNING_REASON,
    AdmissionPolicy,
    NamespaceLimits,
    Refused,
    admit,
)
from rankpack.operator.tenancy import Tenancy
from rankpack.plan.submission import Submission
from rankpack.store import RunRow, Store

if TYPE_CHECKING:
    from rankpack.operator.simcache import SimulationCache

Obj = dict[str, Any]

URGENT = ("phase", "simId")
"""Status fields written at once (a phase change, a launch); others are coalesced."""


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds_since(stamp: str) -> float:
    try:
        t = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, (dt.datetime.now(dt.UTC) - t).total_seconds())


class SimulationApi:
    """The Simulations of the served namespaces (and the Events on them), through the
    project's REST boundary (`ClientKubeApi.request`): plain JSON, typed errors
    (`NotFound`, `Conflict`, `ApiError`). One list per namespace (the operator holds no
    cluster-wide right); a Simulation is named by its key (`simulation_key`)."""

    def __init__(self, api: ClientKubeApi, namespace: str | Sequence[str]) -> None:
        self.api = api
        self.namespaces = (namespace,) if isinstance(namespace, str) else tuple(namespace)
        self.namespace = self.namespaces[0]
        """The first served namespace (a key without one names a Simulation there)."""
        self.cache: SimulationCache | None = None
        """Where `list` reads them (listed once, then watched); None: a List per call."""

    def path_in(self, namespace: str) -> str:
        return f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{namespace}/{crd.PLURAL}"

    @property
    def path(self) -> str:
        """The first namespace's Simulations collection."""
        return self.path_in(self.namespace)

    def _at(self, key: str) -> str:
        ns, _, name = key.rpartition("/")
        return f"{self.path_in(ns or self.namespace)}/{name}"

    def list(self) -> list[Obj]:
        """Every served namespace's Simulations; an error in any is the listing's (a
        namespace that does not answer must not look empty)."""
        if self.cache is not None:
            return self.cache.list()
        items: list[Obj] = []
        for ns in self.namespaces:
            items += self.api.request("GET", self.path_in(ns)).get("items", [])
        return items

    def _saw(self, obj: Obj) -> Obj:
        if self.cache is not None:
            self.cache.saw(obj)
        return obj

    def get(self, key: str) -> Obj:
        return self.api.request("GET", self._at(key))

    def watch(self, timeout_s: float, namespace: str | None = None) -> Iterator[Obj]:
        """The changes of a namespace's Simulations (default: the first) until the apiserver
        ends the watch."""
        return self.api.watch(self.path_in(namespace or self.namespace), timeout_s=timeout_s)

    def create(self, body: Obj) -> Obj:
        ns = str((body.get("metadata") or {}).get("namespace") or self.namespace)
        return self.api.request("POST", self.path_in(ns), body=body)

    def replace_status(self, obj: Obj) -> Obj:
        """Replace the status under the object's resourceVersion (`Conflict` if it
        changed)."""
        meta = obj["metadata"]
        key = f"{meta.get('namespace') or self.namespace}/{meta['name']}"
        return self._saw(self.api.request("PUT", f"{self._at(key)}/status", body=obj))

    def events(self, name: str | None = None) -> builtins.list[Obj]:
        """The core/v1 Events on Simulations (on ``name`` only, if given), oldest first."""
        selector = f"involvedObject.kind={crd.KIND}"
        if name:
            selector += f",involvedObject.name={name}"
        found = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/events",
                                 query={"fieldSelector": selector})  # fmt: skip
        return sorted(found.get("items", []), key=_event_order)

    def patch_status(self, key: str, status: Obj) -> Obj:
        return self._saw(self.api.request(
            "PATCH", f"{self._at(key)}/status", body={"status": status},
            content_type="application/merge-patch+json",
        ))  # fmt: skip


def simulation_key(obj: Obj, several: bool) -> str:
    """A Simulation's key: ``namespace/name`` when several namespaces are served (client-go's
    cache key), else its name (a name holds no '/', so a key is never ambiguous)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name"))
    return f"{meta.get('namespace')}/{name}" if several and meta.get("namespace") else name


LAUNCH_FIELDS = ("usage", "launcher", "simId", "runId", "runDir", "startedAt",
                 "expectedIterations", "iterations", "progress", "staged")  # fmt: skip
"""What `SimulationQueue.started` writes into a Simulation's status (a requeue removes it)."""

HOLD_REASONS = {
    "cooldown": "Cooldown",
    "max-concurrent": "MaxConcurrent",
    "no-room": "NoRoom",
    "quota": "QuotaExceeded",
    "no-gain": "NoGain",
}
"""The policy's launch-held codes as the Queued condition's reason."""


def condition(kind: str, status: bool, reason: str, message: str) -> Obj:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": now_rfc3339(),
    }


def staged_to_json(staged: StagedCase) -> Obj:
    return {
        "runDir": str(staged.run_dir),
        "caseName": staged.case_name,
        "caseSource": staged.case_source,
        "solver": staged.solver,
        "cellsPerRank": list(staged.cells_per_rank),
        "expectedIterations": staged.expected_iterations,
        **({"resumedFrom": staged.resumed_from} if staged.resumed_from else {}),
        **({"startIterations": staged.start_iterations} if staged.start_iterations else {}),
    }


def staged_from_json(d: Obj) -> StagedCase:
    return StagedCase(
        run_dir=Path(d["runDir"]),
        case_name=str(d["caseName"]),
        case_source=str(d["caseSource"]),
        solver=str(d["solver"]),
        cells_per_rank=tuple(int(c) for c in d["cellsPerRank"]),
        expected_iterations=int(d["expectedIterations"]),
        resumed_from=str(d["resumedFrom"]) if d.get("resumedFrom") else None,
        start_iterations=int(d.get("startIterations") or 0),
    )


def resume_to_json(resume: Resume) -> Obj:
    """What a Simulation requeued after a lost node keeps in its status (``resume``): its
    case, to be staged again from its last write by whichever operator launches it."""
    return {
        "staged": staged_to_json(resume.staged),
        "iterationsAtLoss": resume.iterations_at_loss,
        "lostRunId": resume.lost_run_id,
        "why": resume.why[:1000],
        "losses": resume.losses,
        "iterationsLost": resume.iterations_lost,
    }


def resume_from_json(d: Obj | None) -> Resume | None:
    """`resume_to_json` read back (None: none, or not readable: it starts over)."""
    if not d:
        return None
    try:
        return Resume(
            staged=staged_from_json(d["staged"]),
            iterations_at_loss=int(d.get("iterationsAtLoss") or 0),
            lost_run_id=int(d["lostRunId"]) if d.get("lostRunId") is not None else None,
            why=str(d.get("why") or ""), losses=int(d.get("losses") or 1),
            iterations_lost=int(d.get("iterationsLost") or 0),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError):
        return None


class SimulationQueue:
    """`JobSource` over the Simulations of a namespace (see the module doc)."""

    def __init__(
        self,
        api: SimulationApi,
        store: Store,
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
        self.status_interval_s = status_interval_s
        """At most one status patch per Simulation per this many seconds, but `URGENT` ones."""
        self.clock = clock
        self.written: dict[str, float] = {}
        """Simulation key -> when its status was last written (`clock`)."""
        self.tenancy = tenancy
        """The served namespaces' run directories, volumes and case roots (None: the loop's
        own, one namespace, as before)."""
        self.limits = limits or NamespaceLimits()
        """How many Simulations one namespace may have queued and running."""
        self.holds: dict[str, tuple[str, str]] = {}
        """Simulation key (`simulation_key`) -> the hold (reason, message) last written
        into its status."""
        self.placement = placement
        """The backend's facts (`Backend.placement`): where usage and duty cycles come from
        (``usage``: node-agent, node-local) and how ranks are started (``launcher``), written
        into each Simulation's status at launch."""
        self.store = store
        self.identity = identity
        self.admission = admission
        """What the admin allows Simulations to ask for (None: everything, as before)."""
        self.cluster_millis = cluster_millis
        """What all nodes can allocate (for `DoesNotFit`), asked only while checking."""
        self.on_event = on_event or (lambda name, detail: None)
        self.ids: dict[str, int] = {}
        """Simulation key -> the queue id the loop knows it by (stable in this process)."""
        self.names: dict[int, str] = {}
        self.run_ids: dict[int, int] = {}
        self.uids: dict[str, str] = {}
        """Simulation key -> metadata.uid (what its Events refer to)."""
        self.sim_names: dict[str, str] = {}
        """The backend's sim id -> Simulation key."""
        self.conditions: dict[str, list[Obj]] = {}
        """Simulation key -> its conditions as last written (one per type)."""
        self.outbox: dict[str, Obj] = {}
        """Status patches not written yet (the apiserver did not answer)."""
        self.api_error: str | None = None
        """Why the last call failed (None: the last call succeeded)."""
        self.uncertain: set[str] = set()
        """Claims whose answer was lost (the apiserver went away): checked in `flush`."""
        self.listed: dict[str, str] | None = None
        """Key -> uid of every Simulation in the last listing that succeeded."""
        self.holding: dict[int, str] = {}
        """Queue id -> uid of the Simulations this process claimed or adopted and has not
        finished: what `withdrawn` looks for in each listing."""
        self.gone: set[int] = set()
        """Withdrawn jobs: their end is written nowhere (their Simulation is gone)."""
        self._next_id = 1
        self.lock = threading.Lock()

    def _id(self, name: str) -> int:
        with self.lock:
            if name not in self.ids:
                self.ids[name] = self._next_id
                self.names[self._next_id] = name
                self._next_id += 1
            return self.ids[name]

    # -- JobSource ---------------------------------------------------------------------------

    def _list(self) -> list[Obj] | None:
        """The Simulations, or None if the apiserver did not answer."""
        try:
            items = self.api.list()
        except ApiError as exc:
            self.api_error = _first_line(exc)
            return None
        self.api_error = None
        listed: dict[str, str] = {}
        for obj in items:
            meta, key = obj.get("metadata") or {}, self._key(obj)
            listed[key] = str(meta.get("uid") or "")
            if meta.get("uid"):
                self.uids[key] = str(meta["uid"])
        self.listed = listed
        return items

    def idle(self) -> bool:
        """Nothing queued or running, on a listing that succeeded."""
        items = self._list()
        if items is None:
            return False
        return not any(
            (o.get("status") or {}).get("phase") in (None, "Queued", "Running") for o in items
        )

    def pending(self) -> list[Job]:
        """The Simulations waiting to be launched, oldest first. One that first arrives is
        admitted (`admit`) and counted against its namespace's queued limit (refused
        ``TooManyQueued`` beyond it); one whose namespace runs as many as allowed waits
        ``Queued`` (``MaxRunningPerNamespace``) and is not handed to the loop."""
        jobs: list[Job] = []
        self.flush()
        listed = self._list()
        if listed is None:
            return jobs  # no new work while the apiserver does not answer
        items = sorted(
            listed,
            key=lambda o: (o["metadata"].get("creationTimestamp", ""), o["metadata"]["name"]),
        )
        running, queued = self._counts(items)
        for obj in items:
            phase = (obj.get("status") or {}).get("phase")
            if phase not in (None, "Queued"):
                continue
            name = self._key(obj)
            ns = self._namespace(obj)
            unwritten = self.outbox.get(name)
            if unwritten is not None and unwritten.get("phase", "Queued") != "Queued":
                continue  # a change out of the queue is not written yet: not pending
            # (an unwritten "Queued" keeps its place: skipping it let a later Simulation
            # become the head while the apiserver was slow to answer)
            try:
                sub = crd.submission_of(obj)
                if self.admission is not None and phase is None:
                    # checked once, when it first arrives: a refusal ends it before anything
                    # is staged or created (a Queued one was admitted by this rule)
                    policy = replace(self._admission_of(ns),
                                     cluster_millis=self.cluster_millis())  # fmt: skip
                    admit(sub, policy)
            except Refused as exc:
                self.fail(name, exc.failure.code, exc.failure.message)
                continue
            except UserError as exc:
                self._fail_invalid(obj, str(exc))
                continue
            if phase is None:
                refusal = self.limits.queued_refusal(ns, queued.get(ns, 0))
                if refusal:
                    self.fail(name, FailureCode.TOO_MANY_QUEUED, refusal)
                    continue
                queued[ns] = queued.get(ns, 0) + 1
                self._patch(name, {"phase": "Queued", "conditions": self._set_conditions(
                    name, condition("Queued", True, "Submitted", "waiting for the operator"),
                )})  # fmt: skip
            hold = self.limits.running_hold(ns, running.get(ns, 0))
            if hold:
                self._hold(name, MAX_RUNNING_REASON, hold)
                continue
            job = self._job(self._id(name), sub, ns)
            resume = resume_from_json((obj.get("status") or {}).get("resume"))
            jobs.append(job if resume is None else replace(job, resume=resume))
        return jobs

    def _admission_of(self, namespace: str) -> AdmissionPolicy:
        """The admin's policy for a Simulation of ``namespace`` (its own case roots)."""
        assert self.admission is not None
        if self.tenancy is None:
            return self.admission
        return self.tenancy.admission_of(self.admission, namespace)

    def _job(self, queue_id: int, sub: Submission, namespace: str) -> Job:
        """The loop's job: in its namespace, with that namespace's run directories and
        volume (`Tenancy`)."""
        t = self.tenancy
        if t is None:
            return Job(queue_id, sub)
        return Job(queue_id, sub, namespace=namespace, runs_root=t.runs_root_of(namespace),
                   volume=t.volume_of(namespace))  # fmt: skip

    def _key(self, obj: Obj) -> str:
        return simulation_key(obj, self.tenancy is not None and self.tenancy.several)

    def _namespace(self, obj: Obj) -> str:
        return str((obj.get("metadata") or {}).get("namespace") or self.api.namespace)

    def _counts(self, items: Sequence[Obj]) -> tuple[dict[str, int], dict[str, int]]:
        """Per namespace: Simulations Running (claimed, by any operator) and Queued
        (admitted; one that has no phase yet is counted when it is admitted)."""
        running: dict[str, int] = {}
        queued: dict[str, int] = {}
        for obj in items:
            phase = (obj.get("status") or {}).get("phase")
            counts = running if phase == "Running" else queued if phase == "Queued" else None
            if counts is not None:
                ns = self._namespace(obj)
                counts[ns] = counts.get(ns, 0) + 1
        return running, queued

    def claim(self, job: Job) -> bool:
        name = self.names[job.queue_id]
        try:
            obj = self.api.get(name)
        except ApiError:
            return False
        status = dict(obj.get("status") or {})
        if status.get("phase") not in (None, "Queued"):
            return False
        self.conditions[name] = list(status.get("conditions") or [])
        conditions = self._set_conditions(
            name,
            condition("Queued", False, "Claimed", f"claimed by {self.identity}"),
            condition("Running", True, "Claimed", f"claimed by {self.identity}"),
        )
        status.pop("reason", None)  # why it waited: over once it is claimed
        status.pop("message", None)
        self.holds.pop(name, None)
        status.update(phase="Running", operator=self.identity, conditions=conditions)
        obj["status"] = status
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        with self.lock:  # the claim writes the whole status: an unwritten "Queued" is stale
            self.outbox.pop(name, None)
        try:
            self.api.replace_status(obj)
        except Conflict:  # another operator claimed it first
            self.api_error = None
            return False
        except ApiError as exc:
            # the apiserver went away: not claimed (or its answer was lost: `flush` checks),
            # it stays Queued and is tried again later
            self.api_error = _first_line(exc)
            self.uncertain.add(name)
            return False
        self.uncertain.discard(name)
        self.holding[job.queue_id] = uid
        self.written[name] = self.clock()
        return True

    def started(self, job: Job, run_id: int, sim_id: str, staged: StagedCase) -> None:
        self.run_ids[job.queue_id] = run_id
        name = self.names[job.queue_id]
        self.sim_names[sim_id] = name
        facts = self.placement()
        self._patch(name, {
            "usage": facts.get("usage"),
            "launcher": facts.get("launcher"),
            "simId": sim_id,
            "runId": run_id,
            "runDir": str(staged.run_dir),
            "startedAt": now_rfc3339(),
            "expectedIterations": staged.expected_iterations,
            "iterations": 0,
            "progress": progress_text(0, staged.expected_iterations),
            "staged": staged_to_json(staged),
            **self._resumed(job, staged),
            "conditions": self._set_conditions(
                name, condition("Running", True, "Launched", f"simulation {sim_id}")
            ),
        })  # fmt: skip

    @staticmethod
    def _resumed(job: Job, staged: StagedCase) -> Obj:
        """A launch that resumes a run a lost node cut short: ``nodeLost`` says from where
        and the iterations lost (its ``resume`` is done with)."""
        if job.resume is None:
            return {}
        r = job.resume
        return {"resume": None, "nodeLost": {
            "losses": r.losses, "lostRunId": r.lost_run_id, "why": r.why[:1000],
            "iterationsAtLoss": r.done_at_loss(staged),
            "resumedFrom": staged.resumed_from or "start",
            "iterationsKept": staged.start_iterations,
            "iterationsLost": r.lost_now(staged),
            "iterationsLostTotal": r.iterations_lost + r.lost_now(staged),
        }}  # fmt: skip

    def finished(
        self, job: Job, status: str, message: str = "", failure: FailureCode | None = None
    ) -> None:
        """Its end in its status: ``Succeeded``, or ``Failed`` with the code as the status's
        and the conditions' reason (``failure`` when it ended before it had a run, else the
        run's own code, `RunResult.failure` in the store's run row)."""
        name = self.names.get(job.queue_id)
        if name is None:
            return
        self.holding.pop(job.queue_id, None)
        if job.queue_id in self.gone:  # its Simulation was deleted: nothing to write
            self.forget(job.queue_id)
            return
        if status == "queued":  # interrupted before launch: back to the queue
            self.requeue(name, "the operator stopped before launch")
            return
        if status == "interrupted":
            return  # stopped with the operator: it is still running and will be adopted
        result: Obj = {"status": status}
        patch: Obj = {}
        run_id = self.run_ids.get(job.queue_id)
        code = failure or (FailureCode.STAGE_FAILED if message else None)  # before a run
        if message:
            result["message"] = message
        if run_id is not None:
            try:
                run = self.store.get_run(run_id)
            except UserError:
                run = None
            if run is not None:
                message = run.message or ""
                code = _failure_code(run)
                result.update(
                    iterations=run.iterations,
                    wallSeconds=round(run.wall_s or 0.0, 3),
                    cpuSeconds=round(run.cpu_s or 0.0, 3),
                    message=message,
                    restarts=run.restarts,
                    resizes=sum(1 for r in run.resizes if r.status == "completed"),
                )
                patch.update(
                    iterations=run.iterations,
                    resizes=result["resizes"],
                    restarts=run.restarts,
                    progress=run.progress,
                )
        phase = "Succeeded" if status == "completed" else "Failed"
        if phase == "Succeeded":
            ended = condition("Succeeded", True, "Completed", message or status)
        else:
            reason = code or FailureCode.OTHER
            result["reason"] = str(reason)
            ended = condition("Failed", True, reason, message or status)
            patch.update(reason=str(reason), message=(message or status)[:1000])
        patch.update(
            phase=phase,
            result=result,
            conditions=self._set_conditions(
                name, condition("Running", False, ended["reason"], "ended"),
                condition("ResizeDeferred", False, "Ended", "the run ended"), ended,
            ),
        )  # fmt: skip
        self._patch(name, patch)
        self.on_event("finished", {"simulation": name, "phase": phase})

    def heartbeat(self, jobs: Sequence[Job]) -> None:
        pass  # the Lease is the operator's heartbeat; status carries the progress

    def held(self, job: Job, code: str, reason: str) -> None:
        """The head of the queue waits: its status's reason and message and its Queued
        condition say why (``QuotaExceeded`` when the namespace's ResourceQuota leaves no
        room)."""
        name = self.names.get(job.queue_id)
        if name is None:
            return
        self._hold(name, HOLD_REASONS.get(code, "Waiting"), reason)

    def _hold(self, name: str, why: str, message: str) -> None:
        """Its status says why it waits (written when that changes)."""
        if self.holds.get(name) == (why, message):
            return
        self.holds[name] = (why, message)
        conditions = self._set_conditions(name, condition("Queued", True, why, message))
        self._patch(name, {"reason": why, "message": message[:1000], "conditions": conditions})

    def requeued(self, job: Job, why: Failure) -> None:
        """Its launch was refused for a reason that passes (the namespace's quota, taken
        between plan and create; nothing of it is left), or a lost node cut its run short
        (``NodeLost``: its ``resume`` keeps the staged case and the iterations done): back
        to ``Queued`` with the code as its reason, its launch forgotten (sim id, run,
        staged case), to be launched again."""
        name = self.names.get(job.queue_id)
        if name is None:
            return
        self.run_ids.pop(job.queue_id, None)
        self.holding.pop(job.queue_id, None)  # back in the queue: not this loop's any more
        self.holds.pop(name, None)
        self.sim_names = {k: v for k, v in self.sim_names.items() if v != name}
        reason = str(why.code)
        resume = {"resume": resume_to_json(job.resume)} if job.resume is not None else {}
        self._patch(name, {
            "phase": "Queued", "operator": None, "reason": reason,
            "message": why.message[:1000],
            **dict.fromkeys(LAUNCH_FIELDS), **resume,
            "conditions": self._set_conditions(
                name, condition("Running", False, reason, why.message),
                condition("Queued", True, reason, why.message),
            ),
        })  # fmt: skip
        self.on_event("requeued", {"simulation": name, "reason": reason})

    def withdrawn(self) -> set[int]:
        """The Simulations this operator claimed that are gone from the last listing, or
        were deleted and created again under the same name (another uid): their runs are
        stopped and released by the loop (`kubectl delete simulation` stops a run)."""
        listed = self.listed
        if listed is None:
            return set()
        gone = set()
        for qid, uid in list(self.holding.items()):
            name = self.names.get(qid)
            if name is not None and (name not in listed or (uid and listed[name] != uid)):
                gone.add(qid)
        self.gone |= gone
        return gone

    def forget(self, queue_id: int) -> None:
        """A withdrawn job: nothing of it is written back (its Simulation is gone)."""
        name = self.names.pop(queue_id, None)
        if name is None:
            return
        self.ids.pop(name, None)
        self.gone.discard(queue_id)
        self.holding.pop(queue_id, None)
        self.run_ids.pop(queue_id, None)
        self.conditions.pop(name, None)
        self.outbox.pop(name, None)
        self.sim_names = {k: v for k, v in self.sim_names.items() if v != name}

    # -- adoption ----------------------------------------------------------------------------

    def running_for_adoption(self) -> list[Adopted] | None:
        """Running Simulations that were launched (have a sim id and a staged case); None
        if the apiserver did not answer. What this process has recorded and not written yet
        is written first (a run that ended is not taken for a running one)."""
        if not self.flush():
            return None
        items = self._list()
        if items is None:
            return None
        out = []
        for obj in items:
            st = obj.get("status") or {}
            if st.get("phase") != "Running" or not st.get("simId") or not st.get("staged"):
                continue
            name = self._key(obj)
            self.conditions[name] = list(st.get("conditions") or [])
            self.sim_names[str(st["simId"])] = name
            try:
                sub = crd.submission_of(obj)
                staged = staged_from_json(st["staged"])
            except (UserError, KeyError, TypeError, ValueError):
                continue
            qid = self._id(name)
            self.holding[qid] = str((obj.get("metadata") or {}).get("uid") or "")
            if st.get("runId") is not None:
                self.run_ids[qid] = int(st["runId"])
            out.append(Adopted(
                job=self._job(qid, sub, self._namespace(obj)), sim_id=str(st["simId"]),
                run_id=int(st["runId"]) if st.get("runId") is not None else None,
                staged=staged, elapsed_s=_seconds_since(str(st.get("startedAt", ""))),
            ))  # fmt: skip
        return out

    def claimed_not_launched(self) -> list[str] | None:
        """Running Simulations with no sim id: an operator died between claim and launch
        (None if the apiserver did not answer)."""
        items = self._list()
        if items is None:
            return None
        return [
            self._key(o)
            for o in items
            if (o.get("status") or {}).get("phase") == "Running"
            and not (o.get("status") or {}).get("simId")
        ]

    def requeue(self, name: str, reason: str) -> None:
        self._patch(name, {"phase": "Queued", "operator": None, "conditions": self._set_conditions(
            name, condition("Running", False, "Requeued", reason),
            condition("Queued", True, "Requeued", reason),
        )})  # fmt: skip

    def fail(self, name: str, code: FailureCode, message: str) -> None:
        """End it ``Failed`` without a run (refused, invalid, lost): ``code`` is the status's
        and the conditions' reason."""
        reason = str(code)
        self._patch(name, {
            "phase": "Failed",
            "reason": reason,
            "message": message[:1000],
            "result": {"status": "failed", "reason": reason, "message": message},
            "conditions": self._set_conditions(
                name, condition("Running", False, reason, "ended"),
                condition("Failed", True, reason, message),
            ),
        })  # fmt: skip

    # -- helpers -----------------------------------------------------------------------------

    def _fail_invalid(self, obj: Obj, message: str) -> None:
        self.fail(self._key(obj), FailureCode.INVALID_SPEC, message)

    def _set_conditions(self, name: str, *new: Obj) -> list[Obj]:
        """Its conditions with ``new`` replacing those of the same type (a transition time
        is kept while a condition's status does not change)."""
        with self.lock:
            current = {c.get("type"): c for c in self.conditions.get(name, [])}
            for c in new:
                old = current.get(c["type"])
                if old is not None and old.get("status") == c["status"]:
                    c = {**c, "lastTransitionTime": old.get("lastTransitionTime", c[
                        "lastTransitionTime"])}  # fmt: skip
                current[c["type"]] = c
            self.conditions[name] = list(current.values())
            return list(self.conditions[name])

    def end_term(self) -> None:
        """This operator stopped leading: forget what it had not written but a final phase
        (another leader may act on the Simulations now; a late Queued or progress patch
        would undo its work, an end it recorded would not)."""
        with self.lock:
            self.outbox = {
                name: st for name, st in self.outbox.items()
                if st.get("phase") in ("Succeeded", "Failed")
            }  # fmt: skip
            self.uncertain.clear()

    def _patch(self, name: str, status: Obj) -> None:
        """Merge-patch the status: now if it is `URGENT` (with what waits for it) or due
        (nothing written for ``status_interval_s``), else kept in the outbox for `flush`;
        kept too if the apiserver does not answer (a deleted Simulation's patches are
        dropped)."""
        urgent = any(k in status for k in URGENT)
        with self.lock:
            waiting = name in self.outbox
            if waiting or not (urgent or self._due(name)):
                self.outbox[name] = {**self.outbox.get(name, {}), **status}
                if not urgent:
                    return  # keep the order: older changes go first, merged
                status = self.outbox.pop(name)
        self._write(name, status)

    def _due(self, name: str) -> bool:
        last = self.written.get(name)
        return last is None or self.clock() - last >= self.status_interval_s

    def _write(self, name: str, status: Obj) -> bool:
        """One patch; False (and kept in the outbox) if the apiserver did not answer."""
        try:
            self.api.patch_status(name, status)
        except NotFound:
            return True  # deleted by its user
        except ApiError as exc:
            self.api_error = _first_line(exc)
            with self.lock:
                self.outbox[name] = {**status, **self.outbox.get(name, {})}
            return False
        self.api_error = None
        self.written[name] = self.clock()
        return True

    def flush(self) -> bool:
        """Write the status patches kept while the apiserver did not answer, and those
        coalesced that are due (`URGENT`, or ``status_interval_s`` after the last write);
        False if the apiserver did not answer. A claim whose answer was lost and that did
        take effect (Running, ours, never launched) goes back to the queue."""
        for name in sorted(self.uncertain):
            try:
                st = self.api.get(name).get("status") or {}
            except NotFound:
                st = {}
            except ApiError:
                return False
            self.uncertain.discard(name)
            ours = st.get("phase") == "Running" and st.get("operator") == self.identity
            if ours and not st.get("simId"):
                self.requeue(name, "its claim's answer was lost; back to the queue")
        with self.lock:
            names = list(self.outbox)
        for name in names:
            with self.lock:
                status = self.outbox.get(name)
            if status is None or not (any(k in status for k in URGENT) or self._due(name)):
                continue
            try:
                self.api.patch_status(name, status)
            except NotFound:
                pass  # deleted by its user: its patch is dropped
            except ApiError as exc:
                self.api_error = _first_line(exc)
                return False
            self.written[name] = self.clock()
            with self.lock:
                if self.outbox.get(name) is status:
                    del self.outbox[name]
                elif name in self.outbox:  # patched meanwhile: keep only what is newer
                    newer = self.outbox[name]
                    self.outbox[name] = {k: v for k, v in newer.items()
                                         if status.get(k, object()) != v}  # fmt: skip
                    if not self.outbox[name]:
                        del self.outbox[name]
        self.api_error = None
        return True


def _failure_code(run: RunRow) -> FailureCode:
    """A failed run's code, from its run row (`RunResult.failure`); OTHER for a row without
    one (a database written before codes) or with a code this version does not know."""
    try:
        return FailureCode(run.failure) if run.failure else FailureCode.OTHER
    except ValueError:
        return FailureCode.OTHER


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


def _event_order(e: Obj) -> tuple[str, int]:
    """Oldest first; in the same second, in the order the operator recorded them."""
    when = e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp")
    seq = str((e["metadata"].get("annotations") or {}).get(crd.EVENT_SEQUENCE, ""))
    return str(when or ""), int(seq) if seq.isdigit() else 0
