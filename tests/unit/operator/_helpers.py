"""Helpers of the operator's unit tests: the queue of operator ``op-1`` over the Simulations
of the fake apiserver (`tests.fakeapi.FakeSims`)."""

from __future__ import annotations

from rankpack.operator import queue
from rankpack.operator.admission import NamespaceLimits
from rankpack.operator.simapi import SimulationApi


def new_queue(sims: SimulationApi, **limits: int) -> queue.SimulationQueue:
    """Operator ``op-1``'s queue (``limits``: its per-namespace `NamespaceLimits`)."""
    return queue.SimulationQueue(sims, "op-1", limits=NamespaceLimits(**limits))
