"""Taking over what an earlier operator launched: adoption, at the start of every term.

A leader that starts (after a restart, or after it lost and took the Lease again) reads from
the Simulations' statuses what runs (`running`: sim id, run id, staged case, start time) and
hands each to `ControlLoop.adopt` (`Adoption.adopt_all`); a run that ended under this
process whose end was not written yet is written now (with its result, read from the
store). Simulations claimed and never launched go back to the queue
(`Adoption.requeue_unlaunched`), and the simulations operators launched whose Simulation is
gone are stopped and deleted (orphans). Called by `rankpack.operator.service` through the
queue's public reads (`SimulationQueue.listing`, its index and outbox).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rankpack.backend.kubernetes.tenants import NamespacedBackends
from rankpack.backend.protocol import BackendError, UnknownSimulation
from rankpack.controller.jobs import Adopted
from rankpack.controller.loop import ControlLoop
from rankpack.core.failures import FailureCode
from rankpack.core.results import RunResult
from rankpack.errors import UserError
from rankpack.operator import crd
from rankpack.operator.codec import staged_from_json
from rankpack.operator.queue import SimulationQueue
from rankpack.store import Store

OPERATOR_LABEL = {"rankpack.dev/launched-by": "operator"}
"""On every object of the simulations operators launch (`rankpack run` launches carry none)."""


def running(queue: SimulationQueue) -> list[Adopted] | None:
    """Running Simulations that were launched (have a sim id and a staged case); None
    if the apiserver did not answer. What this process has recorded and not written yet
    is written first (a run that ended is not taken for a running one)."""
    if not queue.flush():
        return None
    listing = queue.listing()
    if listing is None:
        return None
    out = []
    for item in listing.items:
        st = item.status
        if item.phase not in crd.CLAIMED or not st.get("simId") or not st.get("staged"):
            continue
        queue.outbox.seed(item.key, st.get("conditions") or [])
        try:
            sub = crd.submission_of(item.obj)
            staged = staged_from_json(st["staged"])
        except (UserError, KeyError, TypeError, ValueError):
            continue
        qid = queue.index.queue_id(item.key)
        queue.index.hold(qid, item.uid)
        run_id = int(st["runId"]) if st.get("runId") is not None else None
        queue.index.launched(qid, run_id, str(st["simId"]))
        out.append(Adopted(
            job=queue.job(qid, sub, item.namespace), sim_id=str(st["simId"]), run_id=run_id,
            staged=staged, elapsed_s=_seconds_since(str(st.get("startedAt", ""))),
        ))  # fmt: skip
    return out


def claimed_not_launched(queue: SimulationQueue) -> list[str] | None:
    """Claimed Simulations with no sim id: an operator died between claim and launch
    (None if the apiserver did not answer)."""
    listing = queue.listing()
    if listing is None:
        return None
    return [i.key for i in listing.items if i.phase in crd.CLAIMED and not i.status.get("simId")]


@dataclass(frozen=True)
class Adoption:
    """One operator's adoption, term after term (see the module doc)."""

    queue: SimulationQueue
    store: Store
    backend: NamespacedBackends
    say: Callable[[str], None]

    def adopt_all(self, loop: ControlLoop, stop: threading.Event) -> int | None:
        """Adopt every Running Simulation with a sim id (retried while the apiserver does
        not answer); None if the term ended first."""
        queue = self.queue
        found: list[Adopted] | None = None
        while found is None:
            found = running(queue)
            if found is None and stop.wait(2.0):
                return None
        n = 0
        for a in found:
            name = queue.index.names[a.job.queue_id]
            result = _ended_run(self.store, a.run_id)
            if result is not None:  # it ended under this process; only its status was not written
                queue.finished(a.job, result.status, result=result)
                continue
            while not stop.is_set():
                try:
                    loop.adopt(a)
                except UnknownSimulation as exc:
                    queue.fail(name, FailureCode.LOST_ON_RESTART, f"could not be adopted: {exc}")
                    self.say(f"{name}: could not be adopted ({exc}); failed")
                except BackendError as exc:  # the apiserver did not answer: try again
                    self.say(f"{name}: adoption waits ({exc})")
                    stop.wait(2.0)
                    continue
                else:
                    n += 1
                    self.say(f"adopted {name} (simulation {a.sim_id})")
                break
        if not stop.is_set():
            self._discard_orphans({a.sim_id for a in found})
        return None if stop.is_set() else n

    def _discard_orphans(self, held: set[str]) -> None:
        """Simulations an operator launched whose Simulation is gone (deleted while no
        operator ran): nobody will ever follow them, and their pods hold CPU; stopped and
        deleted. Simulations launched otherwise (`rankpack run`) are never touched."""
        try:
            refs = self.backend.list()
        except BackendError as exc:
            self.say(f"cannot list the simulations to find orphans ({_short(exc)})")
            return
        for ref in refs:
            ours = all(ref.labels.get(k) == v for k, v in OPERATOR_LABEL.items())
            if ref.sim_id and ours and ref.sim_id not in held:
                self.say(f"simulation {ref.sim_id} has no Simulation any more: stopped and deleted")
                self.backend.discard(ref.sim_id)

    def requeue_unlaunched(self, stop: threading.Event) -> int:
        """Simulations claimed and never launched go back to the queue; how many."""
        names: list[str] | None = None
        while names is None and not stop.is_set():
            names = claimed_not_launched(self.queue)
            if names is None:
                stop.wait(2.0)
        for name in names or []:
            self.queue.requeue(name, "its operator stopped between claim and launch")
        return len(names or [])


def _ended_run(store: Store, run_id: int | None) -> RunResult | None:
    """The result of run ``run_id`` if this store has it finished (completed, failed)."""
    if run_id is None:
        return None
    try:
        run = store.get_run(run_id)
    except UserError:
        return None
    return run.result() if run.status in ("completed", "failed") else None


def _seconds_since(stamp: str) -> float:
    try:
        t = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, (dt.datetime.now(dt.UTC) - t).total_seconds())


def _short(exc: Exception) -> str:
    return (str(exc).splitlines() or [""])[0][:200]
