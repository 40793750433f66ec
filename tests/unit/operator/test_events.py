"""The operator's Events on Simulations (`SimulationEvents`, `event_body`): their bodies,
their order within one second, and their wait while the apiserver is down."""

from __future__ import annotations

from typing import Any

import pytest

from rankpack.operator import crd, events, simapi
from rankpack.store import EventRow
from tests.fakeapi import Down
from tests.unit.operator._helpers import event_row

Obj = dict[str, Any]


@pytest.mark.parametrize(
    ("row", "etype", "reason"),
    [
        (event_row("launch", queue_id=1, sim="s1", request_millis=[500, 500]), "Normal",
         "Launched"),
        (event_row("resize", rank=0, request_millis=300, reason="duty 0.3"), "Normal", "Resized"),
        (event_row("resize-deferred", rank=1, reason="OutOfcpu"), "Warning", "ResizeDeferred"),
        (event_row("resize-deferred", rank=1, reason="x", final=True), "Warning",
         "ResizeNeverApplied"),
        (event_row("wait-mode", mode="polite", reason="sharing"), "Normal", "WaitMode"),
        (event_row("finished", status="completed"), "Normal", "Succeeded"),
        (event_row("finished", status="failed", reason="rank pod p was deleted", code="PodDeleted"),
         "Warning", "PodDeleted"),
        (event_row("finished", status="failed", reason="exit code 1"), "Warning", "RunFailed"),
        (event_row("launch-held", reason="no room"), None, None),
    ],
)  # fmt: skip
def test_event_bodies(row: EventRow, etype: str | None, reason: str | None) -> None:
    body = events.event_body(row, "sim-a", "uid-a", "ns", "op-1")
    if etype is None:
        assert body is None
        return
    assert body is not None
    assert (body["type"], body["reason"]) == (etype, reason)
    want = {"apiVersion": crd.API_VERSION, "kind": "Simulation", "name": "sim-a",
            "namespace": "ns", "uid": "uid-a"}  # fmt: skip
    assert body["involvedObject"] == want
    assert "\n" not in body["message"] and len(body["message"]) <= 1000
    if row.detail.get("reason"):
        assert str(row.detail["reason"]) in body["message"]


def test_events_posted_in_one_second_are_listed_in_the_order_recorded() -> None:
    bodies = []
    for i, kind in enumerate(("stage", "learned-sizes", "launch"), start=8):
        row = EventRow(i, 7, "2026-01-01T00:00:00+00:00", 1.0, kind, {}, 3)
        body = events.event_body(row, "sim-a", None, "ns", "op-1")
        assert body is not None and body["metadata"]["annotations"] == {crd.EVENT_SEQUENCE: str(i)}
        body["lastTimestamp"] = "2026-01-01T00:00:05Z"  # all in the same second
        bodies.append(body)
    earlier = {**bodies[0], "lastTimestamp": "2026-01-01T00:00:04Z", "reason": "Earlier"}
    shuffled = [bodies[2], bodies[0], earlier, bodies[1]]
    ordered = sorted(shuffled, key=simapi.event_order)
    assert [b["reason"] for b in ordered] == ["Earlier", "Staging", "LearnedSizes", "Launched"]


def test_events_wait_while_the_apiserver_is_down_and_go_out_in_order() -> None:
    import threading
    import time

    posted: list[str] = []
    refused: list[str] = []
    tried = threading.Event()
    down = {"on": True}

    def post(body: Obj) -> None:
        if down["on"]:
            refused.append(body["reason"])
            tried.set()
            raise Down("refused")
        posted.append(body["reason"])

    ev = events.SimulationEvents(post, "ns", "op", name_of=lambda e: "a", uid_of=lambda n: None)
    ev.start()
    ev.add(
        [
            event_row("launch"),
            event_row("resize", rank=0),
            event_row("finished", status="completed"),
        ]
    )
    assert tried.wait(10), "the events worker never tried to post"
    # it tried while the apiserver was down: the first event, kept with the others
    assert refused[0] == "Launched"
    assert posted == [] and len(ev.queue) == 3
    down["on"] = False
    ev.wake.set()
    deadline = time.monotonic() + 10
    while len(posted) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    ev.stop()
    assert posted == ["Launched", "Resized", "Succeeded"]


def test_a_post_whose_answer_was_lost_is_not_posted_twice() -> None:
    """Each Event has its own name (the Simulation's, then the store event's id): the retry
    of a POST the apiserver took but whose answer was lost gets 409 and counts as posted."""
    import threading

    from rankpack.backend.kubernetes.api.kubeapi import ApiError

    created: dict[str, str] = {}
    lost_once = {"launch": True}
    done = threading.Event()

    def post(body: Obj) -> None:
        name = body["metadata"]["name"]
        if name in created:
            raise ApiError(409, "AlreadyExists", f"events {name} already exists")
        created[name] = body["reason"]
        if lost_once.pop("launch", False):  # it was created; the answer never came
            raise ApiError(0, "timed out")
        if len(created) == 2:
            done.set()

    ev = events.SimulationEvents(post, "ns", "op-1", name_of=lambda e: "sim-a",
                                 uid_of=lambda n: None)  # fmt: skip
    ev.start()
    from dataclasses import replace

    ev.add([replace(event_row("launch"), id=11),
            replace(event_row("finished", status="completed"), id=12)])  # fmt: skip
    assert done.wait(15), created
    ev.stop()
    assert sorted(created.values()) == ["Launched", "Succeeded"] and not ev.queue
    names = list(created)
    assert all(n.startswith("sim-a.") for n in names) and len(set(names)) == 2
    # another operator's store numbers its events from 1 too: its names differ, as do a
    # recreated Simulation's (another uid)
    row = event_row("launch")
    name = events.event_name("sim-a", row, "uid-1", "op-1")
    assert name != events.event_name("sim-a", row, "uid-1", "op-2")
    assert name != events.event_name("sim-a", row, "uid-2", "op-1")
    assert name == events.event_name("sim-a", row, "uid-1", "op-1")  # a retry: the same
