"""Leader election on a coordination.k8s.io Lease: only the holder of the Lease acts.

`Lease` follows client-go's (and the official Python client's) elector on plain JSON through
the project's REST boundary (`ClientKubeApi.request`): try to take the Lease every
``retry_s``; a Lease held by another identity is free once its record has not changed for
``lease_s``; the leader renews it every ``lease_s / 3`` (at least ``retry_s``; a failed
renewal is tried again every ``retry_s``) by replacing the record it last wrote, with no
read first (client-go's fast path; a conflict reads it again), so leading costs the
apiserver one request per renewal (issue 29); a leader that cannot renew for ``renew_s``
since its last renewal has lost it. An unreachable or
refusing apiserver is a failed attempt like any other (retried), so a leader whose apiserver
is away loses the Lease after ``renew_s`` and a follower keeps following; 401/403 answers
are remembered (`refused_since`) so the operator can say the identity may not use Leases.
`release` gives the Lease up at a clean stop (client-go's ReleaseOnCancel).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from rankpack.backend.kubernetes.api.client import ClientKubeApi
from rankpack.backend.kubernetes.api.kubeapi import ApiError, Conflict, NotFound

log = logging.getLogger("rankpack.operator")

Obj = dict[str, Any]


@dataclass(frozen=True)
class LeaseTerms:
    name: str
    namespace: str
    identity: str
    lease_s: int
    """Lease duration (whole seconds, as the Lease stores it)."""
    renew_s: int
    """A leader that cannot renew for this long has lost the Lease."""
    retry_s: int


class Lease:
    """One candidacy: `leading` is set once it holds the Lease, `lost` when it ends."""

    def __init__(self, api: ClientKubeApi, terms: LeaseTerms) -> None:
        self.api, self.terms = api, terms
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{terms.namespace}/leases/{terms.name}"
        self.leading = threading.Event()
        self.lost = threading.Event()
        self.released = False
        """Given up at a clean stop: no attempt is made from then on."""
        self.last_error: tuple[int, str] | None = None
        self.refused_since: float | None = None
        """When 401/403 answers began (None: the last answer was not one): an apiserver
        that has just started refuses for a moment until its authorizer has synced."""
        self._observed: tuple[Any, ...] | None = None
        self._observed_t = 0.0
        self._mine: Obj | None = None
        """The Lease as this leader last wrote it (renewed without reading it first)."""
        self.thread = threading.Thread(target=self._run, daemon=True, name="lease")

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        try:
            self._elect()
        except Exception as exc:  # a bug here must end the term, not hang it: say what
            log.warning("leader election ended: %r", exc)
        finally:
            self.lost.set()

    def _elect(self) -> None:
        retry = self.terms.retry_s
        while not self._attempt():
            if self.released:
                return
            time.sleep(retry)
        self.leading.set()
        every = max(float(retry), self.terms.lease_s / 3)
        renewed = time.monotonic()
        while not self.released:
            time.sleep(every)
            while not self._attempt():
                if self.released or time.monotonic() >= renewed + self.terms.renew_s:
                    return  # could not renew in time: the term ends
                time.sleep(retry)
            renewed = time.monotonic()

    def _attempt(self) -> bool:
        """Take or renew the Lease once; True if this identity holds it now."""
        if self.released:
            return False
        now = _micro_time()
        mine = self._mine if self.leading.is_set() else None
        if mine is not None:  # renew what this leader last wrote (a conflict reads it again)
            spec = {**(mine.get("spec") or {}), "renewTime": now}
            try:
                self._mine = self.api.request("PUT", self.path, body={**mine, "spec": spec})
                return True
            except Conflict:
                self._mine = None
            except ApiError as exc:
                self._note(exc)
                return False
        try:
            lease = self.api.request("GET", self.path)
        except NotFound:
            return self._create(now)
        except ApiError as exc:
            self._note(exc)
            return False
        self.refused_since = None
        spec = dict(lease.get("spec") or {})
        holder = spec.get("holderIdentity")
        record = tuple(spec.get(k) for k in ("holderIdentity", "leaseDurationSeconds",
                                              "acquireTime", "renewTime"))  # fmt: skip
        if record != self._observed:
            self._observed, self._observed_t = record, time.monotonic()
        ours = holder == self.terms.identity
        fresh = self._observed_t + self.terms.lease_s > time.monotonic()
        if holder and not ours and fresh:
            return False  # held by another whose lease has not expired
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
        spec.update(
            holderIdentity=self.terms.identity,
            leaseDurationSeconds=self.terms.lease_s,
            acquireTime=spec.get("acquireTime") if ours and spec.get("acquireTime") else now,
            renewTime=now,
            leaseTransitions=transitions,
        )
        lease["spec"] = spec
        try:
            self._mine = self.api.request("PUT", self.path, body=lease)
        except ApiError as exc:  # Conflict: someone else wrote it first
            self.last_error = (exc.status, _first_line(exc))
            return False
        return True

    def _create(self, now: str) -> bool:
        t = self.terms
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": t.name, "namespace": t.namespace},
            "spec": {"holderIdentity": t.identity, "leaseDurationSeconds": t.lease_s,
                     "acquireTime": now, "renewTime": now, "leaseTransitions": 0},
        }  # fmt: skip
        try:
            self._mine = self.api.request("POST", self.path.rsplit("/", 1)[0], body=body)
        except ApiError as exc:
            self.last_error = (exc.status, _first_line(exc))
            return False
        return True

    def _note(self, exc: ApiError) -> None:
        self.last_error = (exc.status, _first_line(exc))
        if exc.status in (401, 403):
            self.refused_since = self.refused_since or time.monotonic()
        else:
            self.refused_since = None

    def release(self) -> None:
        """Give the Lease up at a clean stop (idle, or stopped by the user), so the next
        operator leads at its next attempt instead of after the lease duration. A Lease
        with no holder is free to every elector. A renewal racing this makes the replace
        conflict; the Lease then expires as usual."""
        self.released = True
        if not self.leading.is_set() or self.lost.is_set():
            return
        try:
            lease = self.api.request("GET", self.path)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") == self.terms.identity:
                spec.pop("holderIdentity", None)
                lease["spec"] = spec
                self.api.request("PUT", self.path, body=lease)
        except ApiError as exc:  # it expires after lease_s anyway
            log.info("could not give up the Lease %s: %s", self.path, exc)


def _micro_time() -> str:
    """Now as a Kubernetes MicroTime."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
