"""The operator's queue of Simulations (`SimulationQueue`) without a cluster: what is pending
while the apiserver is down, claims, holds, ends (with the run's result), withdrawals and a
lost node's requeue. Against `FakeSims`
(the real `SimulationApi` over the fake apiserver)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rankpack.core.failures import FailureCode
from rankpack.operator import codec, queue
from tests.fakeapi import Down, FakeSims
from tests.unit.operator._helpers import new_queue

Obj = dict[str, Any]


def test_pending_while_the_apiserver_is_down_is_empty_and_not_idle(
    sims: FakeSims, tmp_path: Path
) -> None:
    sims.add("a")
    q = new_queue(sims)
    assert [q.index.names[j.queue_id] for j in q.pending()] == ["a"]
    sims.down = True
    assert q.pending() == [] and q.api_error and not q.idle()
    sims.down = False
    assert len(q.pending()) == 1 and q.api_error is None


def test_claim_is_exclusive_and_a_lost_answer_is_requeued(sims: FakeSims, tmp_path: Path) -> None:
    sims.add("a")
    q1, q2 = new_queue(sims), queue.SimulationQueue(sims, "op-2")  # type: ignore[arg-type]
    (job,) = q1.pending()
    (job2,) = q2.pending()
    assert q1.claim(job) and not q2.claim(job2)
    assert sims.objs["a"]["status"]["operator"] == "op-1"
    # a claim whose answer is lost: it did take effect, nothing was launched -> requeued
    sims.add("b")
    jb = next(j for j in q1.pending() if q1.index.names[j.queue_id] == "b")
    real = sims.replace_status

    def lost(obj: Obj) -> Obj:
        real(obj)
        raise Down("timed out")

    sims.replace_status = lost  # type: ignore[method-assign]
    assert not q1.claim(jb) and "b" in q1.uncertain
    assert q1.flush()
    assert sims.objs["b"]["status"]["phase"] == "Queued" and not q1.uncertain


def test_an_unwritten_queued_status_keeps_its_place_and_a_claim_supersedes_it(
    sims: FakeSims, tmp_path: Path
) -> None:
    for name in ("a", "b", "c"):
        sims.add(name)  # created in this order
    q = new_queue(sims)
    real_patch = sims.patch_status

    def slow_for_a(name: str, status: Obj) -> Obj:
        if name == "a":
            raise Down("timed out")  # the apiserver does not answer this one in time
        return real_patch(name, status)

    sims.patch_status = slow_for_a  # type: ignore[method-assign]
    first = [q.index.names[j.queue_id] for j in q.pending()]
    assert first == ["a", "b", "c"] and "a" in q.outbox.waiting()
    # still unwritten at the next look: "a" is still the head, not skipped
    assert [q.index.names[j.queue_id] for j in q.pending()] == ["a", "b", "c"]
    (head, *_) = q.pending()
    assert q.claim(head)
    assert "a" not in q.outbox.waiting()  # the claim wrote the whole status
    sims.patch_status = real_patch  # type: ignore[method-assign]
    assert q.flush()
    assert sims.objs["a"]["status"]["phase"] == "Starting"  # not undone by a stale Queued
    assert [q.index.names[j.queue_id] for j in q.pending()] == ["b", "c"]


def test_a_staging_failure_puts_its_message_in_the_status(sims: FakeSims, tmp_path: Path) -> None:
    from rankpack.controller.jobs import Job

    sims.add("a")
    q = new_queue(sims)
    (job,) = q.pending()
    q.finished(job, "failed", "nosuchcase is not an OpenFOAM case (no system/controlDict)")
    st = sims.objs["a"]["status"]
    assert st["phase"] == "Failed"
    message = "nosuchcase is not an OpenFOAM case (no system/controlDict)"
    assert st["result"] == {"status": "failed", "reason": "StageFailed", "message": message}
    assert (st["reason"], st["message"]) == ("StageFailed", message)
    assert isinstance(job, Job)


def test_a_failure_before_the_run_carries_its_code(sims: FakeSims, tmp_path: Path) -> None:
    sims.add("a")
    q = new_queue(sims)
    (job,) = q.pending()
    q.finished(job, "failed", "nosuchcase: no system/controlDict", FailureCode.NOT_A_CASE)
    st = sims.objs["a"]["status"]
    failed = {c["type"]: c for c in st["conditions"]}["Failed"]
    assert st["reason"] == failed["reason"] == st["result"]["reason"] == "NotACase"


def test_a_held_head_says_why_in_its_queued_condition(sims: FakeSims, tmp_path: Path) -> None:
    sims.add("a")
    q = new_queue(sims)
    (job,) = q.pending()
    q.held(job, "quota", "queued simulation 1 needs 1000m ... held within the ResourceQuota q")
    queued = {c["type"]: c for c in sims.objs["a"]["status"]["conditions"]}["Queued"]
    assert (queued["status"], queued["reason"]) == ("True", "QuotaExceeded")
    assert "ResourceQuota q" in queued["message"]
    assert sims.objs["a"]["status"]["phase"] == "Queued"


def test_a_claimed_simulation_deleted_or_created_again_is_withdrawn(
    sims: FakeSims, tmp_path: Path
) -> None:
    sims.add("a")
    sims.add("b")
    sims.add("c")
    q = new_queue(sims)
    jobs = {q.index.names[j.queue_id]: j for j in q.pending()}
    assert q.claim(jobs["a"]) and q.claim(jobs["b"])  # c stays queued: never held
    assert q.withdrawn() == set()
    del sims.objs["a"]  # kubectl delete
    sims.objs["b"]["metadata"]["uid"] = "uid-b-again"  # deleted and created again
    del sims.objs["c"]
    q.pending()  # a listing
    assert q.withdrawn() == {jobs["a"].queue_id, jobs["b"].queue_id}
    patches = len(sims.patches)
    q.finished(jobs["b"], "interrupted")  # the loop stopped it: nothing is written back
    assert len(sims.patches) == patches
    assert jobs["b"].queue_id not in q.index.names and "b" not in q.index.ids
    sims.objs["b"]["status"] = {}
    (again,) = [j for j in q.pending() if q.index.names[j.queue_id] == "b"]
    assert again.queue_id != jobs["b"].queue_id  # the new object is a new job


def test_a_node_lost_simulation_is_queued_again_with_what_to_resume_from(
    sims: FakeSims, tmp_path: Path
) -> None:
    """Issue 28, item 4: requeued (not Failed) with reason NodeLost; whichever operator
    launches it next reads its case and the iterations done from its status, and its launch
    writes from where it resumed and the iterations lost."""
    from dataclasses import replace

    from rankpack.case.staging import StagedCase
    from rankpack.controller.jobs import Resume
    from rankpack.core.failures import Failure

    sims.add("a")
    q = new_queue(sims)
    (job,) = q.pending()
    assert q.claim(job)
    staged = StagedCase(Path("/runs/r1"), "pitzDaily", "/src", "simpleFoam", (6000, 6000), 300)
    q.started(job, 1, "s1", staged)
    resume = Resume(staged, iterations_at_loss=137, lost_run_id=1, why="node n lost")
    q.requeued(replace(job, resume=resume), Failure(FailureCode.NODE_LOST, "node n lost; ..."))
    st = sims.objs["a"]["status"]
    assert (st["phase"], st["reason"]) == ("Queued", "NodeLost")
    assert "simId" not in st and st["resume"]["iterationsAtLoss"] == 137
    # the next operator (a fresh queue: nothing in memory) resumes it
    q2 = queue.SimulationQueue(sims, "op-2")  # type: ignore[arg-type]
    (again,) = q2.pending()
    assert again.resume == resume
    assert q2.claim(again)
    at = replace(staged, resumed_from="120", start_iterations=120)
    q2.started(again, 2, "s2", at)
    st = sims.objs["a"]["status"]
    assert "resume" not in st and st["staged"]["startIterations"] == 120
    assert st["nodeLost"]["resumedFrom"] == "120" and st["nodeLost"]["iterationsLost"] == 17
    assert codec.staged_from_json(st["staged"]) == at  # an adopter counts on from 120


def test_an_end_carries_the_runs_result_into_the_status(sims: FakeSims, tmp_path: Path) -> None:
    """`finished` is handed the run's result (`JobSource.finished`): its figures and its
    code are written without the store being read."""
    from rankpack.core.results import RankResult, ResizeRecord, RunResult

    sims.add("a")
    q = new_queue(sims)
    (job,) = q.pending()
    assert q.claim(job)
    resized = ResizeRecord(0, 1.0, 1000, 600, "completed", 0.2)
    result = RunResult(
        id=3, status="failed", case="pitzDaily", solver="simpleFoam", run_dir="/runs/r",
        n_ranks=2, qos="burstable", total_millis=2000, iterations=42, expected_iterations=100,
        wall_s=12.3456, cpu_s=20.0, exit_code=137, message="rank pod p was deleted",
        ranks=(RankResult(0, 1.0, 1000, None, 12.34567, 12.3, 0, 0.0, cells=10, duty=0.61234,
                          node="n1"),
               RankResult(1, 1.0, 1000, None, 7.66, 7.7, 0, 0.0, cells=10)),
        failure="PodDeleted", resizes=(resized, ResizeRecord(1, 2.0, 1000, 1400, "deferred", None)),
        restarts=1,
    )  # fmt: skip
    q.finished(job, "failed", result=result)
    st = sims.objs["a"]["status"]
    assert (st["phase"], st["reason"], st["message"]) == ("Failed", "PodDeleted", result.message)
    assert st["result"] == {"status": "failed", "message": result.message, "iterations": 42,
                            "wallSeconds": 12.346, "cpuSeconds": 20.0, "restarts": 1,
                            "resizes": 1, "reason": "PodDeleted",
                            # each rank over its whole run (its duty when known)
                            "ranks": [{"rank": 0, "cpuSeconds": 12.346, "duty": 0.6123,
                                       "node": "n1"}, {"rank": 1, "cpuSeconds": 7.66}]}  # fmt: skip
    assert (st["iterations"], st["resizes"], st["restarts"], st["progress"]) == (42, 1, 1, "42/100")
