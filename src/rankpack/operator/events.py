"""The operator's Kubernetes Events: what the control loop records, on its Simulations.

Every tick the operator hands the loop's new store events (`EventRow`) to `SimulationEvents`,
which turns those that concern one Simulation (launch, resize and its outcomes, wait-mode
switches, adoption, the end, ...) into core/v1 Events whose ``involvedObject`` is that
Simulation, so ``kubectl describe simulation NAME``, ``kubectl get events`` and ``rankpack
events --backend kubernetes`` show them. They are posted by a background thread (the API's
latency never slows the loop); while the apiserver does not answer they wait in a bounded
queue (oldest dropped first) and are posted when it answers again.

`event_body` is pure (a table test checks it); `post` is the only I/O.
"""

from __future__ import annotations

import collections
import datetime as dt
import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rankpack.backend.kubernetes.api.kubeapi import ApiError
from rankpack.backend.kubernetes.objects import builders
from rankpack.core.failures import FailureCode
from rankpack.operator import crd
from rankpack.store import EventRow

Obj = dict[str, Any]

COMPONENT = "rankpack-operator"
MAX_QUEUED = 1000
"""Events kept while the apiserver does not answer; older ones are dropped first."""

QUOTA_CODES = frozenset({"quota", str(FailureCode.QUOTA_EXCEEDED)})
"""Event codes that mean the namespace's quota: posted with the reason ``QuotaExceeded``."""

# store event kind -> (Event type, reason). Kinds not listed are not posted (queue-level
# notes such as launch-held are in the metrics, but a hold for quota; per-tick details stay
# in the store).
KINDS: Mapping[str, tuple[str, str]] = {
    "stage": ("Normal", "Staging"),
    "learned-sizes": ("Normal", "LearnedSizes"),
    "launch-fitted": ("Normal", "LaunchFitted"),
    "placement": ("Normal", "Placed"),
    "solver": ("Normal", "Solver"),
    "warning": ("Warning", "CaseWarning"),
    "launch": ("Normal", "Launched"),
    "launch-failed": ("Warning", "LaunchFailed"),
    "launch-requeued": ("Warning", "Requeued"),
    "node-lost": ("Warning", "NodeLost"),
    "resumed": ("Normal", "Resumed"),
    "adopted": ("Normal", "Adopted"),
    "profile-start": ("Normal", "Profiling"),
    "profile-restart": ("Normal", "ProfilingRestarted"),
    "resize": ("Normal", "Resized"),
    "resize-held": ("Normal", "ResizeHeld"),
    "resize-skipped": ("Normal", "ResizeSkipped"),
    "resize-capped": ("Normal", "ResizeCapped"),
    "resize-deferred": ("Warning", "ResizeDeferred"),
    "resize-retry": ("Warning", "ResizeRetry"),
    "resize-given-up": ("Warning", "ResizeGivenUp"),
    "resize-rejected": ("Warning", "ResizeRejected"),
    "resize-infeasible": ("Warning", "ResizeInfeasible"),
    "resize-failed": ("Warning", "ResizeFailed"),
    "wait-mode": ("Normal", "WaitMode"),
    "wait-mode-failed": ("Warning", "WaitModeFailed"),
    "restart": ("Warning", "RankRestarted"),
    "finished": ("Normal", "Finished"),
}


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def message_of(e: EventRow) -> str:
    """One line: the reason, then the facts (rank, request, mode, status ...)."""
    detail = {k: v for k, v in e.detail.items() if k not in ("queue_id", "sim", "reason")}
    facts = ", ".join(f"{k}={v}" for k, v in detail.items() if v is not None and v != "")
    reason = str(e.detail.get("reason") or "")
    text = f"{reason} ({facts})" if reason and facts else reason or facts or e.kind
    return text.replace("\n", " ")[:1000]


def event_body(
    e: EventRow, name: str, uid: str | None, namespace: str, instance: str
) -> Obj | None:
    """The core/v1 Event for store event ``e`` on Simulation ``name`` (None: not posted)."""
    code = str(e.detail.get("code") or "")
    quota = code in QUOTA_CODES
    kind = KINDS.get(e.kind)
    if kind is None and e.kind == "launch-held" and quota:
        kind = ("Normal", "QuotaExceeded")  # the one hold posted: the quota is someone's
    if kind is None:
        return None
    etype, reason = kind
    if quota:  # a launch or a grow the namespace's quota does not allow (now)
        reason = "QuotaExceeded"
    if e.kind == "finished":
        ok = e.detail.get("status") == "completed"
        # a failed run's Event says why with its code (the loop records it as ``code``)
        code = str(e.detail.get("code") or FailureCode.OTHER)
        etype, reason = ("Normal", "Succeeded") if ok else ("Warning", code)
    if e.kind == "resize-deferred" and e.detail.get("final"):
        reason = "ResizeNeverApplied"
    involved: Obj = {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "name": name,
                     "namespace": namespace}  # fmt: skip
    if uid:
        involved["uid"] = uid
    return builders.core_event(involved, etype, reason, message_of(e), crd.MANAGED_BY,
                               COMPONENT, _now(), (f"{crd.GROUP}/operator", instance),
                               {crd.EVENT_SEQUENCE: str(e.id)},
                               event_name(name, e, uid, instance))  # fmt: skip


def event_name(simulation: str, e: EventRow, uid: str | None, instance: str) -> str:
    """The Event's own name: the Simulation's, then the store event it tells (a retried POST
    whose first answer was lost gets 409 instead of posting it twice). The Simulation's uid,
    the operator's identity and the event's time keep apart what two stores, each numbering
    from 1, would otherwise name alike."""
    digest = hashlib.sha256(f"{uid}|{instance}|{e.multiplex_id}|{e.at}".encode()).hexdigest()
    return f"{simulation[:200].rstrip('.-')}.{digest[:10]}-{e.id}"


class SimulationEvents:
    """Turns the loop's store events into Events on Simulations and posts them."""

    def __init__(
        self,
        post: Callable[[Obj], object],
        namespace: str,
        instance: str,
        *,
        name_of: Callable[[EventRow], str | None],
        uid_of: Callable[[str], str | None],
    ) -> None:
        self.post = post
        self.namespace, self.instance = namespace, instance
        self.name_of, self.uid_of = name_of, uid_of
        self.queue: collections.deque[Obj] = collections.deque(maxlen=MAX_QUEUED)
        self.wake = threading.Event()
        self.stopped = threading.Event()
        self.posted = 0
        self.failed = 0
        self.thread = threading.Thread(target=self._run, daemon=True, name="events")

    def start(self) -> None:
        self.thread.start()

    def stop(self, drain_s: float = 5.0) -> None:
        """Post what is queued (bounded by ``drain_s``), then stop."""
        self.wake.set()
        deadline = dt.datetime.now().timestamp() + drain_s
        while self.queue and dt.datetime.now().timestamp() < deadline and self.thread.is_alive():
            self.stopped.wait(0.1)
        self.stopped.set()
        self.wake.set()

    def add(self, events: Sequence[EventRow]) -> None:
        for e in events:
            key = self.name_of(e)
            if key is None:
                continue
            # a key names its namespace when several are served (`simapi.simulation_key`)
            ns, _, name = key.rpartition("/")
            body = event_body(e, name, self.uid_of(key), ns or self.namespace, self.instance)
            if body is not None:
                self.queue.append(body)
        if self.queue:
            self.wake.set()

    def _run(self) -> None:
        delay = 0.5
        while not self.stopped.is_set():
            self.wake.wait(5.0)
            self.wake.clear()
            while self.queue and not self.stopped.is_set():
                body = self.queue[0]
                try:
                    self.post(body)
                except ApiError as exc:
                    if exc.status == 409:  # posted already: its first answer was lost
                        self.queue.popleft()
                        continue
                    # the apiserver is away: keep it, try again later
                    self.failed += 1
                    self.stopped.wait(delay)
                    delay = min(delay * 2, 10.0)
                    continue
                delay = 0.5
                self.posted += 1
                if self.queue and self.queue[0] is body:
                    self.queue.popleft()
