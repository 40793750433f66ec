"""Admission at arrival: `Arrivals` decides, the first time a listing shows a Simulation
(it has no phase yet), whether it is queued.

Its spec must be valid (``InvalidSpec`` otherwise), allowed by the admin's policy
(`rankpack.operator.admission.admit`, against its own namespace's case roots when several
namespaces are served), and its namespace must have room in its queue
(`NamespaceLimits.queued_refusal`, ``TooManyQueued``). A refusal ends it ``Failed`` with the
code and the reason in its status before anything is staged or created; an admitted one is
``Queued`` and counted against its namespace's queued limit. Called by
`rankpack.operator.queue.SimulationQueue.listing` on every listing; a Simulation already
``Queued`` was admitted by this rule and is not checked again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rankpack.core.failures import FailureCode
from rankpack.errors import UserError
from rankpack.operator import crd, transitions
from rankpack.operator.admission import (
    AdmissionPolicy,
    NamespaceLimits,
    Refused,
    admit,
    case_root_of,
)
from rankpack.operator.listing import Listed, Listing
from rankpack.operator.outbox import StatusOutbox
from rankpack.operator.tenancy import Tenancy


class Arrivals:
    """Admits the Simulations a listing shows for the first time (see the module doc)."""

    def __init__(
        self,
        outbox: StatusOutbox,
        *,
        admission: AdmissionPolicy | None = None,
        cluster_millis: Callable[[], int | None] = lambda: None,
        limits: NamespaceLimits | None = None,
        tenancy: Tenancy | None = None,
    ) -> None:
        self.outbox = outbox
        self.admission = admission
        """What the admin allows Simulations to ask for (None: everything)."""
        self.cluster_millis = cluster_millis
        """What all nodes can allocate (for `DoesNotFit`), asked only while checking."""
        self.limits = limits or NamespaceLimits()
        self.tenancy = tenancy

    def admit(self, listing: Listing) -> Listing:
        """Decide each Simulation with no phase yet, oldest first: ``Queued`` or ``Failed``
        (written into its status); the listing as it is now."""
        queued = listing.counts("Queued")
        phases: dict[str, str] = {}
        for item in listing.oldest_first():
            if item.phase is not None:
                continue
            unwritten = self.outbox.unwritten(item.key)
            if unwritten is not None and unwritten.get("phase", "Queued") != "Queued":
                continue  # a change out of the queue is not written yet
            phases[item.key] = self._decide(item, queued)
        return listing.with_phases(phases)

    def _decide(self, item: Listed, queued: dict[str, int]) -> str:
        ns = item.namespace
        try:
            sub = crd.submission_of(item.obj)
            if self.admission is not None:
                # a refusal ends it before anything is staged or created
                admit(sub, replace(self._policy_of(ns), cluster_millis=self.cluster_millis()))
        except Refused as exc:
            return self._fail(item.key, exc.failure.code, exc.failure.message)
        except UserError as exc:
            return self._fail(item.key, FailureCode.INVALID_SPEC, str(exc))
        refusal = self.limits.queued_refusal(ns, queued.get(ns, 0))
        if refusal:
            return self._fail(item.key, FailureCode.TOO_MANY_QUEUED, refusal)
        queued[ns] = queued.get(ns, 0) + 1
        self.outbox.patch(item.key, *transitions.submitted())
        return "Queued"

    def _fail(self, key: str, code: FailureCode, message: str) -> str:
        self.outbox.patch(key, *transitions.failed(code, message))
        return "Failed"

    def case_root(self, namespace: str, case: str) -> str | None:
        """The case root ``case`` was admitted under in ``namespace`` (None: none)."""
        if self.admission is None:
            return None
        return case_root_of(case, self._policy_of(namespace))

    def _policy_of(self, namespace: str) -> AdmissionPolicy:
        """The admin's policy for a Simulation of ``namespace`` (its own case roots)."""
        assert self.admission is not None
        if self.tenancy is None:
            return self.admission
        return self.tenancy.admission_of(self.admission, namespace)
