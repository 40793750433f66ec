"""The control loop's job source on Kubernetes: the Simulations of one namespace.

A Simulation with no phase (just created) or phase ``Queued`` is pending, oldest first.
Claiming one replaces its status with ``Running`` under its resourceVersion, so two
operators can never both claim it (the apiserver answers 409 to the second). The loop's
progress reaches each Simulation's status (`StatusWriter`, at most every ``interval_s``),
its end sets ``Succeeded``/``Failed`` with the run's result. Everything the operator needs to
follow a running Simulation after a restart (sim id, run id, staged case, start time) is in
its status, so `running_for` can hand them to `ControlLoop.adopt`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rankpack.case.staging import StagedCase
from rankpack.controller.loop import Adopted, Job, SimView
from rankpack.errors import UserError
from rankpack.operator import crd
from rankpack.store import Store

Obj = dict[str, Any]


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds_since(stamp: str) -> float:
    try:
        t = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, (dt.datetime.now(dt.UTC) - t).total_seconds())


class SimulationApi:
    """The Simulations of one namespace through the official client's CustomObjectsApi."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        from kubernetes import client

        self.custom: Any = client.CustomObjectsApi(api_client)
        self.namespace = namespace

    def _args(self) -> tuple[str, str, str, str]:
        return crd.GROUP, crd.VERSION, self.namespace, crd.PLURAL

    def list(self) -> list[Obj]:
        return list(self.custom.list_namespaced_custom_object(*self._args()).get("items", []))

    def get(self, name: str) -> Obj:
        return dict(self.custom.get_namespaced_custom_object(*self._args(), name))

    def create(self, body: Obj) -> Obj:
        return dict(self.custom.create_namespaced_custom_object(*self._args(), body))

    def replace_status(self, obj: Obj) -> Obj:
        """Replace the status under the object's resourceVersion (409 if it changed)."""
        name = obj["metadata"]["name"]
        return dict(self.custom.replace_namespaced_custom_object_status(*self._args(), name, obj))

    def patch_status(self, name: str, status: Obj) -> Obj:
        return dict(
            self.custom.patch_namespaced_custom_object_status(
                *self._args(), name, {"status": status}
            )
        )


def _conflict(exc: Exception) -> bool:
    return getattr(exc, "status", None) == 409


def _condition(kind: str, status: bool, reason: str, message: str) -> Obj:
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
    }


def staged_from_json(d: Obj) -> StagedCase:
    return StagedCase(
        run_dir=Path(d["runDir"]),
        case_name=str(d["caseName"]),
        case_source=str(d["caseSource"]),
        solver=str(d["solver"]),
        cells_per_rank=tuple(int(c) for c in d["cellsPerRank"]),
        expected_iterations=int(d["expectedIterations"]),
    )


class SimulationQueue:
    """`JobSource` over the Simulations of a namespace (see the module doc)."""

    def __init__(
        self,
        api: SimulationApi,
        store: Store,
        identity: str,
        *,
        on_event: Callable[[str, Obj], None] | None = None,
    ) -> None:
        self.api = api
        self.store = store
        self.identity = identity
        self.on_event = on_event or (lambda name, detail: None)
        self.ids: dict[str, int] = {}
        """Simulation name -> the queue id the loop knows it by (stable in this process)."""
        self.names: dict[int, str] = {}
        self.run_ids: dict[int, int] = {}
        self.lock = threading.Lock()

    def _id(self, name: str) -> int:
        with self.lock:
            if name not in self.ids:
                self.ids[name] = len(self.ids) + 1
                self.names[self.ids[name]] = name
            return self.ids[name]

    # -- JobSource ---------------------------------------------------------------------------

    def pending(self) -> list[Job]:
        jobs = []
        items = sorted(
            self.api.list(),
            key=lambda o: (o["metadata"].get("creationTimestamp", ""), o["metadata"]["name"]),
        )
        for obj in items:
            phase = (obj.get("status") or {}).get("phase")
            if phase not in (None, "Queued"):
                continue
            name = obj["metadata"]["name"]
            try:
                sub = crd.submission_of(obj)
            except UserError as exc:
                self._fail_invalid(obj, str(exc))
                continue
            if phase is None:
                self._patch(
                    name,
                    {
                        "phase": "Queued",
                        "conditions": [
                            _condition("Queued", True, "Submitted", "waiting for the operator")
                        ],
                    },
                )
            jobs.append(Job(self._id(name), sub))
        return jobs

    def claim(self, job: Job) -> bool:
        name = self.names[job.queue_id]
        try:
            obj = self.api.get(name)
        except Exception:
            return False
        status = dict(obj.get("status") or {})
        if status.get("phase") not in (None, "Queued"):
            return False
        status.update(
            phase="Running",
            operator=self.identity,
            conditions=[_condition("Running", True, "Claimed", f"claimed by {self.identity}")],
        )
        obj["status"] = status
        try:
            self.api.replace_status(obj)
        except Exception as exc:
            if _conflict(exc):
                return False
            raise
        return True

    def started(self, job: Job, run_id: int, sim_id: str, staged: StagedCase) -> None:
        self.run_ids[job.queue_id] = run_id
        self._patch(self.names[job.queue_id], {
            "simId": sim_id,
            "runId": run_id,
            "runDir": str(staged.run_dir),
            "startedAt": now_rfc3339(),
            "expectedIterations": staged.expected_iterations,
            "iterations": 0,
            "progress": f"0/{staged.expected_iterations}",
            "staged": staged_to_json(staged),
            "conditions": [_condition("Running", True, "Launched", f"simulation {sim_id}")],
        })  # fmt: skip

    def finished(self, job: Job, status: str) -> None:
        name = self.names.get(job.queue_id)
        if name is None:
            return
        if status == "queued":  # interrupted before launch: back to the queue
            self._patch(
                name,
                {
                    "phase": "Queued",
                    "operator": None,
                    "conditions": [
                        _condition("Queued", True, "Requeued", "the operator stopped before launch")
                    ],
                },
            )
            return
        if status == "interrupted":
            return  # stopped with the operator: it is still running and will be adopted
        result: Obj = {"status": status}
        patch: Obj = {}
        run_id = self.run_ids.get(job.queue_id)
        message = ""
        if run_id is not None:
            try:
                run = self.store.get_run(run_id)
            except UserError:
                run = None
            if run is not None:
                message = run.message or ""
                result.update(
                    iterations=run.iterations,
                    wallSeconds=round(run.wall_s or 0.0, 3),
                    cpuSeconds=round(run.cpu_s or 0.0, 3),
                    message=message,
                    restarts=run.restarts,
                    resizes=sum(1 for r in run.resizes if r.status == "completed"),
                )
                exp = run.expected_iterations
                patch.update(
                    iterations=run.iterations,
                    resizes=result["resizes"],
                    restarts=run.restarts,
                    progress=f"{run.iterations}/{exp}" if exp else str(run.iterations),
                )
        phase = "Succeeded" if status == "completed" else "Failed"
        patch.update(
            phase=phase,
            result=result,
            conditions=[
                _condition("Succeeded" if phase == "Succeeded" else "Failed", True,
                           "Completed" if phase == "Succeeded" else "RunFailed",
                           message or status)
            ],
        )  # fmt: skip
        self._patch(name, patch)
        self.on_event("finished", {"simulation": name, "phase": phase})

    def heartbeat(self, jobs: Sequence[Job]) -> None:
        pass  # the Lease is the operator's heartbeat; status carries the progress

    # -- adoption ----------------------------------------------------------------------------

    def running_for_adoption(self) -> list[Adopted]:
        """Running Simulations that were launched (have a sim id and a staged case)."""
        out = []
        for obj in self.api.list():
            st = obj.get("status") or {}
            if st.get("phase") != "Running" or not st.get("simId") or not st.get("staged"):
                continue
            name = obj["metadata"]["name"]
            try:
                sub = crd.submission_of(obj)
                staged = staged_from_json(st["staged"])
            except (UserError, KeyError, TypeError, ValueError):
                continue
            qid = self._id(name)
            if st.get("runId") is not None:
                self.run_ids[qid] = int(st["runId"])
            out.append(Adopted(
                job=Job(qid, sub), sim_id=str(st["simId"]),
                run_id=int(st["runId"]) if st.get("runId") is not None else None,
                staged=staged, elapsed_s=_seconds_since(str(st.get("startedAt", ""))),
            ))  # fmt: skip
        return out

    def claimed_not_launched(self) -> list[str]:
        """Running Simulations with no sim id: an operator died between claim and launch."""
        return [
            o["metadata"]["name"]
            for o in self.api.list()
            if (o.get("status") or {}).get("phase") == "Running"
            and not (o.get("status") or {}).get("simId")
        ]

    def requeue(self, name: str, reason: str) -> None:
        self._patch(
            name,
            {
                "phase": "Queued",
                "operator": None,
                "conditions": [_condition("Queued", True, "Requeued", reason)],
            },
        )

    def fail(self, name: str, reason: str, message: str) -> None:
        self._patch(
            name,
            {
                "phase": "Failed",
                "result": {"status": "failed", "message": message},
                "conditions": [_condition("Failed", True, reason, message)],
            },
        )

    # -- helpers -----------------------------------------------------------------------------

    def _fail_invalid(self, obj: Obj, message: str) -> None:
        self.fail(obj["metadata"]["name"], "InvalidSpec", message)

    def _patch(self, name: str, status: Obj) -> None:
        for attempt in range(5):
            try:
                self.api.patch_status(name, status)
                return
            except Exception as exc:
                if getattr(exc, "status", None) == 404:
                    return  # deleted by its user
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))


class StatusWriter:
    """A `Display` that copies the loop's view of each Simulation into its status."""

    def __init__(self, queue: SimulationQueue, interval_s: float = 2.0) -> None:
        self.queue = queue
        self.interval_s = interval_s
        self.last: dict[int, float] = {}
        self.listeners: list[Callable[[float, Sequence[SimView]], None]] = []

    def update(self, now_s: float, sims: Sequence[SimView]) -> None:
        for listener in self.listeners:
            listener(now_s, sims)
        t = time.monotonic()
        for view in sims:
            if view.run_id is None or t - self.last.get(view.queue_id, -1e9) < self.interval_s:
                continue
            name = self.queue.names.get(view.queue_id)
            if name is None:
                continue
            self.last[view.queue_id] = t
            exp = view.expected_iterations
            status: Obj = {
                "iterations": view.log.iterations,
                "progress": f"{view.log.iterations}/{exp}" if exp else str(view.log.iterations),
                "resizes": view.resizes,
                "restarts": sum(r.restarts for r in view.ranks),
                "ranks": [
                    {k: v for k, v in {
                        "rank": r.rank, "requestMillis": r.request_millis,
                        "allocatedMillis": r.allocated_millis,
                        "cpuCores": round(r.cpu_cores, 3),
                        "duty": round(r.duty, 4) if r.duty is not None else None,
                    }.items() if v is not None}
                    for r in view.ranks
                ],
            }  # fmt: skip
            # progress is best effort; the end state is written by `finished`
            with contextlib.suppress(Exception):
                self.queue._patch(name, status)

    def close(self) -> None:
        pass
