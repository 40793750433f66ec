"""The operator's queue and the namespace (issue 26, items 5 and 6): a launch refused for
quota goes back to ``Queued`` with ``QuotaExceeded`` in its status and an Event; a hold
says why in the status; a namespace may have only so many Simulations queued (one more is
refused ``TooManyQueued``) and running (the next waits ``MaxRunningPerNamespace``), counted
per namespace; the namespace's ResourceQuota as read (`cpu_quota`). Against `FakeSims` (the
real `SimulationApi` over the fake apiserver)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankpack.case.staging import StagedCase
from rankpack.core.failures import Failure, FailureCode
from rankpack.operator import adoption, events, queue, transitions
from rankpack.operator.admission import NamespaceLimits
from rankpack.operator.status import StatusWriter
from rankpack.store import EventRow, Store
from tests.fakeapi import FakeSims
from tests.unit.operator._helpers import event_row, new_queue

STAGED = StagedCase(Path("/runs/a"), "pitzDaily", "tutorial", "simpleFoam", (1, 1), 100)
QUOTA = Failure(FailureCode.QUOTA_EXCEEDED, "exceeded quota: q; back in the queue")


def _names(q: queue.SimulationQueue) -> list[str]:
    return [q.index.names[j.queue_id] for j in q.pending()]


def test_a_launch_refused_for_quota_goes_back_to_queued_with_its_reason(tmp_path: Path) -> None:
    sims = FakeSims()
    sims.add("a")
    q = new_queue(sims)
    (job,) = q.pending()
    assert q.claim(job)
    q.started(job, 7, "s1", STAGED)
    assert sims.objs["a"]["status"]["simId"] == "s1"
    q.requeued(job, QUOTA)
    st = sims.objs["a"]["status"]
    assert st["phase"] == "Queued" and "operator" not in st
    assert (st["reason"], st["message"]) == ("QuotaExceeded", QUOTA.message)
    for launched in transitions.LAUNCH_FIELDS:  # its launch is forgotten: nothing to adopt
        assert launched not in st, launched
    conditions = {c["type"]: c for c in st["conditions"]}
    assert (conditions["Queued"]["status"], conditions["Queued"]["reason"]) == (
        "True", "QuotaExceeded")  # fmt: skip
    assert conditions["Running"]["status"] == "False"
    assert job.queue_id not in q.index.run_ids and "s1" not in q.index.sim_names
    assert adoption.running(q) == [] and adoption.claimed_not_launched(q) == []
    # pending again under the same id, and claimable; the claim clears why it waited
    (again,) = q.pending()
    assert again.queue_id == job.queue_id and q.claim(again)
    st = sims.objs["a"]["status"]
    assert st["phase"] == "Starting" and "reason" not in st and "message" not in st


def test_a_hold_says_why_in_the_status_and_is_written_once(tmp_path: Path) -> None:
    sims = FakeSims()
    sims.add("a")
    q = new_queue(sims)
    (job,) = q.pending()
    why = "queued simulation 1 needs 2000m: held within the namespace's ResourceQuota q"
    q.held(job, "quota", why)
    st = sims.objs["a"]["status"]
    assert (st["phase"], st["reason"], st["message"]) == ("Queued", "QuotaExceeded", why)
    assert {c["type"]: c["reason"] for c in st["conditions"]}["Queued"] == "QuotaExceeded"
    writes = len(sims.patches)
    q.held(job, "quota", why)
    assert len(sims.patches) == writes


def test_one_simulation_too_many_queued_is_refused(tmp_path: Path) -> None:
    sims = FakeSims()
    for name in ("a", "b", "c"):
        sims.add(name)
    q = new_queue(sims, max_queued=2)
    assert _names(q) == ["a", "b"]
    st = sims.objs["c"]["status"]
    assert (st["phase"], st["reason"]) == ("Failed", "TooManyQueued")
    assert "namespace ns already has 2 Simulations queued" in st["message"]
    assert "--max-queued-per-namespace 2" in st["message"]
    # admitted ones are never refused later; a place that frees is taken by a new one
    assert _names(q) == ["a", "b"]
    sims.objs["a"]["status"]["phase"] = "Running"
    sims.add("d")
    assert _names(q) == ["b", "d"]


def test_a_namespace_at_its_running_limit_waits_and_others_do_not(tmp_path: Path) -> None:
    sims = FakeSims()
    sims.add("a", {"phase": "Running"})
    sims.add("b")
    sims.add("other")
    sims.objs["other"]["metadata"]["namespace"] = "team-b"
    q = new_queue(sims, max_running=1)
    assert _names(q) == ["other"]
    st = sims.objs["b"]["status"]
    assert (st["phase"], st["reason"]) == ("Queued", "MaxRunningPerNamespace")
    assert "namespace ns runs 1 Simulations" in st["message"]
    assert "--max-running-per-namespace 1" in st["message"]
    writes = len(sims.patches)
    assert _names(q) == ["other"] and len(sims.patches) == writes  # said once
    sims.objs["a"]["status"]["phase"] = "Succeeded"
    assert _names(q) == ["b", "other"]


def test_no_limits_by_default_but_100_queued() -> None:
    limits = NamespaceLimits()
    assert limits.max_running is None and limits.max_queued == 100
    assert limits.running_hold("ns", 10_000) == ""
    assert limits.queued_refusal("ns", 99) == "" and limits.queued_refusal("ns", 100)


def test_quota_holds_and_requeues_are_events_with_the_reason_quota_exceeded() -> None:
    for row, etype in (
        (event_row("launch-requeued", code="QuotaExceeded", reason="exceeded quota"), "Warning"),
        (event_row("launch-held", code="quota", reason="held within q"), "Normal"),
        (event_row("resize-capped", code="quota", reason="grows held within q"), "Normal"),
        (event_row("resize-rejected", code="QuotaExceeded", reason="exceeded quota"), "Warning"),
    ):
        body = events.event_body(row, "sim-a", "uid-a", "ns", "op-1")
        assert body is not None, row.kind
        assert (body["type"], body["reason"]) == (etype, "QuotaExceeded"), row.kind
    assert events.event_body(event_row("launch-held", code="no-gain"), "a", None, "ns", "i") is None


def test_a_grow_held_for_quota_sets_resize_held_until_a_resize_completes(
    tmp_path: Path,
) -> None:
    sims = FakeSims()
    sims.add("a", {"phase": "Running"})
    q = new_queue(sims)
    writer = StatusWriter(q)
    writer.resize_held("a", "a wanted 3000m, 1200m fit: grows held within q")
    held = {c["type"]: c for c in sims.objs["a"]["status"]["conditions"]}["ResizeHeld"]
    assert (held["status"], held["reason"]) == ("True", "QuotaExceeded")
    writes = len(sims.patches)
    writer.resize_held("a", "a wanted 3000m, 1200m fit: grows held within q")
    assert len(sims.patches) == writes
    writer.resize_held("a", None)
    held = {c["type"]: c for c in sims.objs["a"]["status"]["conditions"]}["ResizeHeld"]
    assert held["status"] == "False"


def test_held_launches_are_counted_by_their_code() -> None:
    from rankpack.operator.metrics import OperatorMetrics

    metrics = OperatorMetrics()
    metrics.count_events([
        EventRow(1, None, "t", 1.0, "launch-held", {"code": "quota", "reason": "needs 1000m"}, 3),
        EventRow(2, None, "t", 2.0, "launch-held", {"reason": "waits 1.0 s more after"}, 3),
    ])  # fmt: skip
    assert metrics.held.labels("quota")._value.get() == 1
    assert metrics.held.labels("cooldown")._value.get() == 1


def test_the_loop_requeues_a_simulation_whose_launch_the_quota_refused(tmp_path: Path) -> None:
    """The operator's queue under the one loop (simulated backend): the first launch is
    refused for quota; the Simulation goes back to Queued with QuotaExceeded, then runs and
    Succeeds; it never fails."""
    from rankpack.controller.decision import ControllerSettings
    from rankpack.controller.loop import run_jobs
    from rankpack.controller.tracked import LoopSettings
    from tests.unit.controller.test_loop_requeue import TakenTwice

    sims = FakeSims()
    sims.add("a")
    sims.objs["a"]["spec"].update(case={"path": "box"}, budgetMillis=1000, sizing="fixed")
    q = new_queue(sims)
    seen: list[tuple[str, str | None]] = []
    real = sims.patch_status

    def watch(name: str, status: dict[str, Any]) -> dict[str, Any]:
        out = real(name, status)
        st = sims.objs[name]["status"]
        seen.append((st.get("phase", "-"), st.get("reason")))
        return out

    sims.patch_status = watch  # type: ignore[method-assign]
    settings = LoopSettings(runs_root=tmp_path / "runs",
                            controller=ControllerSettings(launch_cooldown_s=0.0))  # fmt: skip
    result = run_jobs(TakenTwice(refusals=1), Store(tmp_path / "db.sqlite"), q, settings)
    assert [r.status for r in result.results] == ["completed"]
    assert ("Queued", "QuotaExceeded") in seen
    assert "Failed" not in {phase for phase, _ in seen}
    assert sims.objs["a"]["status"]["phase"] == "Succeeded"


@pytest.mark.parametrize(
    ("quota", "want"),
    [
        ({"status": {"hard": {"requests.cpu": "1200m"}, "used": {"requests.cpu": "500m"}}},
         (1200, 500)),
        ({"status": {"hard": {"cpu": "2"}, "used": {}}}, (2000, 0)),
        ({"status": {"hard": {"pods": "10"}, "used": {"pods": "2"}}}, None),
        ({}, None),
    ],
)  # fmt: skip
def test_cpu_quota_reads_requests_cpu(quota: dict[str, Any], want: tuple[int, int] | None) -> None:
    from rankpack.backend.kubernetes.objects.status import cpu_quota

    assert cpu_quota(quota) == want
