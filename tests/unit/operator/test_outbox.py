"""The Simulations' status writes (`StatusOutbox`): patches kept while the apiserver is away
and written when it is back, the end of a term, conditions one per type, and writes coalesced
to one patch per Simulation per interval but phase changes (issue 29), with an injected
clock. Against `FakeSims`
(the real `SimulationApi` over the fake apiserver)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankpack.core.failures import FailureCode
from rankpack.operator import queue, transitions
from tests.fakeapi import FakeSims
from tests.fakeclock import FakeClock
from tests.unit.operator._helpers import new_queue


def test_a_status_patch_made_while_down_is_written_when_it_is_back(
    sims: FakeSims, tmp_path: Path
) -> None:
    sims.add("a", {"phase": "Running", "simId": "s1"})
    q = new_queue(sims)
    q.index.queue_id("a")
    sims.down = True
    q.fail("a", FailureCode.POD_DELETED, "rank pod rankpack-s1-1 was deleted")
    q.requeue("a", "x")  # merged after the failure: last write wins per field
    assert "a" in q.outbox.waiting() and not q.flush()
    sims.down = False
    assert q.flush() and not q.outbox.waiting()
    st = sims.objs["a"]["status"]
    assert st["phase"] == "Queued"  # the later write
    assert {c["type"]: c["status"] for c in st["conditions"]}["Queued"] == "True"


def test_end_of_term_keeps_only_final_phases(sims: FakeSims, tmp_path: Path) -> None:
    sims.add("a", {"phase": "Running"})
    sims.add("b", {"phase": "Running"})
    q = new_queue(sims)
    sims.down = True
    q.requeue("a", "stopped before launch")  # another leader may have claimed it since
    q.fail("b", FailureCode.OTHER, "exit code 1")
    q.end_term()
    assert q.outbox.waiting() == {"b"}


def test_conditions_are_one_per_type_and_keep_their_transition_time(
    sims: FakeSims, tmp_path: Path
) -> None:
    sims.add("a")
    q = new_queue(sims)
    first = q.outbox.set_conditions("a", transitions.condition("Running", True, "Claimed", "x"))
    again = q.outbox.set_conditions("a", {**transitions.condition("Running", True, "Launched", "y"),
                                     "lastTransitionTime": "later"})  # fmt: skip
    assert len(again) == 1 and again[0]["reason"] == "Launched"
    assert again[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]


def _coalescing(tmp_path: Path) -> tuple[FakeSims, queue.SimulationQueue, FakeClock]:
    sims = FakeSims()
    sims.add("a", {"phase": "Running", "simId": "s1"})
    clock = FakeClock()
    q = queue.SimulationQueue(sims, "op-1",  # type: ignore[arg-type]
                              status_interval_s=10.0, clock=clock)  # fmt: skip
    q.index.queue_id("a")
    return sims, q, clock


def test_progress_is_written_at_most_once_per_interval(tmp_path: Path) -> None:
    sims, q, clock = _coalescing(tmp_path)
    for t in range(31):  # a tick a second: the loop flushes, then the writer patches
        clock.t = float(t)
        q.flush()
        q.outbox.patch("a", {"iterations": t})
    assert [p["iterations"] for _, p in sims.patches] == [0, 9, 19, 29]
    assert sims.objs["a"]["status"]["iterations"] == 29
    clock.t = 40.0
    q.flush()
    assert sims.objs["a"]["status"]["iterations"] == 30  # the last one is not lost
    assert len(sims.patches) == 5  # at t = 0, 10, 20, 30, 40


def test_a_phase_change_is_written_at_once_with_what_waits(tmp_path: Path) -> None:
    sims, q, clock = _coalescing(tmp_path)
    q.outbox.patch("a", {"iterations": 1})
    clock.t = 1.0
    q.outbox.patch("a", {"iterations": 2, "reason": "NoRoom"})
    assert len(sims.patches) == 1  # coalesced: within the interval
    clock.t = 2.0
    q.fail("a", FailureCode.POD_DELETED, "rank pod rankpack-s1-1 was deleted")
    assert len(sims.patches) == 2 and not q.outbox.waiting()
    _, last = sims.patches[-1]
    assert last["phase"] == "Failed" and last["iterations"] == 2  # carried with it
    assert last["reason"] == "PodDeleted"  # the later write wins per field


def test_a_write_that_fails_waits_and_flush_says_so(tmp_path: Path) -> None:
    sims, q, clock = _coalescing(tmp_path)
    sims.down = True
    q.outbox.patch("a", {"iterations": 3})
    assert "a" in q.outbox.waiting() and not q.flush()
    sims.down = False
    clock.t = 0.5
    assert q.flush() and not q.outbox.waiting()  # it was due when it failed: written once back
    assert sims.patches == [("a", {"iterations": 3})]


@pytest.mark.parametrize("interval", [0.0])
def test_without_an_interval_every_patch_is_written(tmp_path: Path, interval: float) -> None:
    sims = FakeSims()
    sims.add("a", {"phase": "Running"})
    q = queue.SimulationQueue(sims, "op-1",  # type: ignore[arg-type]
                              status_interval_s=interval)  # fmt: skip
    for i in range(3):
        q.outbox.patch("a", {"iterations": i})
    assert len(sims.patches) == 3
