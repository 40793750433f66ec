"""Helpers of the operator's unit tests: the queue of operator ``op-1`` over the Simulations
of the fake apiserver (`tests.fakeapi.FakeSims`), and a store event."""

from __future__ import annotations

from typing import Any

from rankpack.operator import queue
from rankpack.operator.admission import NamespaceLimits
from rankpack.operator.simapi import SimulationApi
from rankpack.store import EventRow


def new_queue(sims: SimulationApi, **limits: int) -> queue.SimulationQueue:
    """Operator ``op-1``'s queue (``limits``: its per-namespace `NamespaceLimits`)."""
    return queue.SimulationQueue(sims, "op-1", limits=NamespaceLimits(**limits))


def event_row(kind: str, **detail: Any) -> EventRow:
    """A store event of run 7 (queue id 1), as the operator's event writer reads it."""
    return EventRow(1, 7, "2026-01-01T00:00:00+00:00", 1.0, kind, detail, 3)
