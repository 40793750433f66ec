"""The operator's `Display`: each tick's view of the Simulations into their status
(`rankpack.operator.status.StatusWriter`), Prometheus metrics (`rankpack.operator.metrics`)
and Events on them (`rankpack.operator.events`), from the loop's view and the store's new
events. Made by `rankpack.operator.service` for the operator's whole life.
"""

from __future__ import annotations

from collections.abc import Sequence

from rankpack.controller.views import SimView
from rankpack.operator.events import QUOTA_CODES, SimulationEvents
from rankpack.operator.metrics import OperatorMetrics
from rankpack.operator.queue import SimulationQueue
from rankpack.operator.status import StatusWriter
from rankpack.store import EventRow, Store


class OperatorDisplay(StatusWriter):
    """Status, metrics and Events from the loop's view and the store's new events."""

    def __init__(self, queue: SimulationQueue, interval_s: float, metrics: OperatorMetrics,
                 events: SimulationEvents) -> None:  # fmt: skip
        super().__init__(queue, interval_s)
        self.metrics, self.events = metrics, events
        self.store: Store | None = None
        """The leader's store (`rankpack.operator.service` sets it while it leads)."""
        self.multiplex_id: int | None = None
        self.last_event = 0

    def update(self, now_s: float, sims: Sequence[SimView]) -> None:
        super().update(now_s, sims)
        self.metrics.update(self.queue.index.names, sims)
        self.drain()

    def resize_held(self, name: str, message: str | None, reason: str = "") -> None:
        """`StatusWriter.resize_held`, and the metric its alert reads."""
        super().resize_held(name, message, reason)
        self.metrics.set_resize_held(name, message is not None)

    def drain(self) -> None:
        """The store's events since the last drain: counted, posted as Events, and a grow
        held for quota shown in the status."""
        if self.multiplex_id is None or self.store is None:
            return
        new = self.store.events(multiplex_id=self.multiplex_id, after_id=self.last_event)
        if new:
            self.last_event = new[-1].id
            self.metrics.count_events(new)
            self.events.add(new)
            self._resizes_held(new)

    def _resizes_held(self, new: Sequence[EventRow]) -> None:
        """A grow held within the quota (or refused by it) shows in the status too."""
        name_of = self.queue.index.key_of_event
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
