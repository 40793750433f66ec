"""The operator's pieces without a cluster: status writes that survive an apiserver outage,
claims, conditions, Events on Simulations, and the session timeline's time axis.

`FakeSims` stands in for `SimulationApi` (the project's own boundary): it keeps objects as
the apiserver returns them and can be switched "down", when every call raises like the
official client does on a refused connection.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.api.kubeapi import ApiError, Conflict
from rankpack.core.failures import FailureCode
from rankpack.operator import crd, events, queue
from rankpack.plan.submission import Submission
from rankpack.store import EventRow, Store

Obj = dict[str, Any]


def Down(message: str) -> ApiError:
    return ApiError(0, "Unreachable", message)


class FakeSims:
    namespace = "ns"

    def __init__(self) -> None:
        self.objs: dict[str, Obj] = {}
        self.down = False
        self.patches: list[tuple[str, Obj]] = []
        self.version = 0

    def _check(self) -> None:
        if self.down:
            raise Down("connection refused")

    def add(self, name: str, status: Obj | None = None) -> None:
        sub = Submission(case="pitzDaily", weights=(1, 1), budget_millis=2000)
        obj = crd.simulation(name, sub)
        stamp = f"2026-01-01T00:00:0{len(self.objs)}Z"
        obj["metadata"].update(uid=f"uid-{name}", resourceVersion="1", creationTimestamp=stamp)
        if status is not None:
            obj["status"] = status
        self.objs[name] = obj

    def list(self) -> list[Obj]:
        self._check()
        return [copy.deepcopy(o) for o in self.objs.values()]

    def get(self, name: str) -> Obj:
        self._check()
        return copy.deepcopy(self.objs[name])

    def replace_status(self, obj: Obj) -> Obj:
        self._check()
        name = obj["metadata"]["name"]
        if obj["metadata"]["resourceVersion"] != self.objs[name]["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")
        self.objs[name]["status"] = copy.deepcopy(obj["status"])
        self._bump(name)
        return copy.deepcopy(self.objs[name])

    def patch_status(self, name: str, status: Obj) -> Obj:
        self._check()
        current = self.objs[name].setdefault("status", {})
        for k, v in status.items():  # a JSON merge patch, one level deep
            if v is None:
                current.pop(k, None)
            else:
                current[k] = copy.deepcopy(v)
        self.patches.append((name, status))
        self._bump(name)
        return copy.deepcopy(self.objs[name])

    def _bump(self, name: str) -> None:
        self.version += 1
        self.objs[name]["metadata"]["resourceVersion"] = str(self.version + 1)


@pytest.fixture
def sims() -> FakeSims:
    return FakeSims()


def _queue(sims: FakeSims, tmp_path: Path) -> queue.SimulationQueue:
    return queue.SimulationQueue(sims, Store(tmp_path / "db.sqlite"), "op-1")  # type: ignore[arg-type]


def test_pending_while_the_apiserver_is_down_is_empty_and_not_idle(
    sims: FakeSims, tmp_path: Path
) -> None:
    sims.add("a")
    q = _queue(sims, tmp_path)
    assert [q.names[j.queue_id] for j in q.pending()] == ["a"]
    sims.down = True
    assert q.pending() == [] and q.api_error and not q.idle()
    sims.down = False
    assert len(q.pending()) == 1 and q.api_error is None


def test_a_status_patch_made_while_down_is_written_when_it_is_back(
    sims: FakeSims, tmp_path: Path
) -> None:
    sims.add("a", {"phase": "Running", "simId": "s1"})
    q = _queue(sims, tmp_path)
    q._id("a")
    sims.down = True
    q.fail("a", FailureCode.POD_DELETED, "rank pod rankpack-s1-1 was deleted")
    q.requeue("a", "x")  # merged after the failure: last write wins per field
    assert "a" in q.outbox and not q.flush()
    sims.down = False
    assert q.flush() and not q.outbox
    st = sims.objs["a"]["status"]
    assert st["phase"] == "Queued"  # the later write
    assert {c["type"]: c["status"] for c in st["conditions"]}["Queued"] == "True"


def test_end_of_term_keeps_only_final_phases(sims: FakeSims, tmp_path: Path) -> None:
    sims.add("a", {"phase": "Running"})
    sims.add("b", {"phase": "Running"})
    q = _queue(sims, tmp_path)
    sims.down = True
    q.requeue("a", "stopped before launch")  # another leader may have claimed it since
    q.fail("b", FailureCode.OTHER, "exit code 1")
    q.end_term()
    assert set(q.outbox) == {"b"}


def test_claim_is_exclusive_and_a_lost_answer_is_requeued(sims: FakeSims, tmp_path: Path) -> None:
    sims.add("a")
    q1, q2 = _queue(sims, tmp_path), queue.SimulationQueue(sims, q_store(tmp_path), "op-2")  # type: ignore[arg-type]
    (job,) = q1.pending()
    (job2,) = q2.pending()
    assert q1.claim(job) and not q2.claim(job2)
    assert sims.objs["a"]["status"]["operator"] == "op-1"
    # a claim whose answer is lost: it did take effect, nothing was launched -> requeued
    sims.add("b")
    jb = next(j for j in q1.pending() if q1.names[j.queue_id] == "b")
    real = sims.replace_status

    def lost(obj: Obj) -> Obj:
        real(obj)
        raise Down("timed out")

    sims.replace_status = lost  # type: ignore[method-assign]
    assert not q1.claim(jb) and "b" in q1.uncertain
    assert q1.flush()
    assert sims.objs["b"]["status"]["phase"] == "Queued" and not q1.uncertain


def q_store(tmp_path: Path) -> Store:
    return Store(tmp_path / "db2.sqlite")


def test_conditions_are_one_per_type_and_keep_their_transition_time(
    sims: FakeSims, tmp_path: Path
) -> None:
    sims.add("a")
    q = _queue(sims, tmp_path)
    first = q._set_conditions("a", queue.condition("Running", True, "Claimed", "x"))
    again = q._set_conditions("a", {**queue.condition("Running", True, "Launched", "y"),
                                     "lastTransitionTime": "later"})  # fmt: skip
    assert len(again) == 1 and again[0]["reason"] == "Launched"
    assert again[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]


def _event(kind: str, **detail: Any) -> EventRow:
    return EventRow(1, 7, "2026-01-01T00:00:00+00:00", 1.0, kind, detail, 3)


@pytest.mark.parametrize(
    ("row", "etype", "reason"),
    [
        (_event("launch", queue_id=1, sim="s1", request_millis=[500, 500]), "Normal", "Launched"),
        (_event("resize", rank=0, request_millis=300, reason="duty 0.3"), "Normal", "Resized"),
        (_event("resize-deferred", rank=1, reason="OutOfcpu"), "Warning", "ResizeDeferred"),
        (_event("resize-deferred", rank=1, reason="x", final=True), "Warning",
         "ResizeNeverApplied"),
        (_event("wait-mode", mode="polite", reason="sharing"), "Normal", "WaitMode"),
        (_event("finished", status="completed"), "Normal", "Succeeded"),
        (_event("finished", status="failed", reason="rank pod p was deleted", code="PodDeleted"),
         "Warning", "PodDeleted"),
        (_event("finished", status="failed", reason="exit code 1"), "Warning", "RunFailed"),
        (_event("launch-held", reason="no room"), None, None),
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
    ordered = sorted(shuffled, key=queue._event_order)
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
    ev.add([_event("launch"), _event("resize", rank=0), _event("finished", status="completed")])
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


def test_session_timeline_puts_earlier_sessions_on_its_clock(tmp_path: Path) -> None:
    from rankpack.operator.plot import session_events

    store = Store(tmp_path / "db.sqlite")
    first = store.start_multiplex(2000, 2, "auto", "kubernetes-operator")
    store.add_event(5, "launch", {"queue_id": 1}, multiplex_id=first, t_s=1.0)
    second = store.start_multiplex(2000, 2, "auto", "kubernetes-operator")
    store.add_event(5, "adopted", {"queue_id": 1}, multiplex_id=second, t_s=0.5)
    store.add_event(5, "finished", {"status": "completed"}, multiplex_id=second, t_s=9.0)
    store.add_event(6, "adopted", {"queue_id": 2}, multiplex_id=second, t_s=0.6)
    got = session_events(store, second)
    kinds = [(e.run_id, e.kind) for e in got]
    assert (5, "launch") in kinds and (5, "adopted") in kinds  # run 5's own launch is kept
    assert (6, "launch") in kinds  # run 6 was launched before any recorded session
    launch5 = next(e for e in got if e.run_id == 5 and e.kind == "launch")
    assert launch5.t_s <= 1.0  # the earlier session started at or before this one


def test_the_timeline_names_each_run_by_its_simulation() -> None:
    from rankpack.report.figures import pyplot, timeline_axes

    at = "2026-01-01T00:00:00+00:00"
    events = [EventRow(1, 5, at, 0.0, "launch", {}, 1),
              EventRow(2, 5, at, 3.0, "finished", {"status": "completed"}, 1),
              EventRow(3, 6, at, 1.0, "launch", {}, 1)]  # fmt: skip
    plt = pyplot()
    fig, ax = plt.subplots()
    timeline_axes(ax, events, {5: "pitzdaily-a"})
    assert [t.get_text() for t in ax.get_yticklabels()] == ["run 5: pitzdaily-a", "run 6"]
    plt.close(fig)


def test_an_unwritten_queued_status_keeps_its_place_and_a_claim_supersedes_it(
    sims: FakeSims, tmp_path: Path
) -> None:
    for name in ("a", "b", "c"):
        sims.add(name)  # created in this order
    q = _queue(sims, tmp_path)
    real_patch = sims.patch_status

    def slow_for_a(name: str, status: Obj) -> Obj:
        if name == "a":
            raise Down("timed out")  # the apiserver does not answer this one in time
        return real_patch(name, status)

    sims.patch_status = slow_for_a  # type: ignore[method-assign]
    first = [q.names[j.queue_id] for j in q.pending()]
    assert first == ["a", "b", "c"] and "a" in q.outbox
    # still unwritten at the next look: "a" is still the head, not skipped
    assert [q.names[j.queue_id] for j in q.pending()] == ["a", "b", "c"]
    (head, *_) = q.pending()
    assert q.claim(head)
    assert "a" not in q.outbox  # the claim wrote the whole status
    sims.patch_status = real_patch  # type: ignore[method-assign]
    assert q.flush()
    assert sims.objs["a"]["status"]["phase"] == "Running"  # not undone by a stale Queued
    assert [q.names[j.queue_id] for j in q.pending()] == ["b", "c"]


def test_a_refused_spec_ends_failed_with_its_reason_and_is_never_a_job(
    sims: FakeSims, tmp_path: Path
) -> None:
    from rankpack.operator.admission import AdmissionPolicy

    sims.add("ok")
    sims.add("root")
    sims.objs["root"]["spec"]["case"]["volume"] = "host:/"
    sims.add("etc")
    sims.objs["etc"]["spec"]["case"]["path"] = "/etc"
    sims.add("shell")
    sims.objs["shell"]["spec"]["solver"] = "sh"
    sims.add("huge")
    sims.objs["huge"]["spec"].update(ranks=4096, weights=[1] * 4096, budgetMillis=4096000)
    policy = AdmissionPolicy(solvers=frozenset({"simpleFoam"}))
    q = queue.SimulationQueue(
        sims, Store(tmp_path / "db.sqlite"), "op-1",  # type: ignore[arg-type]
        admission=policy, cluster_millis=lambda: 2000,
    )  # fmt: skip
    assert [q.names[j.queue_id] for j in q.pending()] == ["ok"]
    want = {"root": "HostVolumeNotAllowed", "etc": "CasePathNotAllowed",
            "shell": "SolverNotAllowed", "huge": "DoesNotFit"}  # fmt: skip
    for name, reason in want.items():
        st = sims.objs[name]["status"]
        assert st["phase"] == "Failed", name
        assert st["result"]["reason"] == reason
        assert st["result"]["message"]
        failed = {c["type"]: c for c in st["conditions"]}["Failed"]
        assert (failed["status"], failed["reason"]) == ("True", reason)
        assert (st["reason"], st["message"]) == (reason, st["result"]["message"])
    # the valid one behind the refused ones is queued at once
    assert sims.objs["ok"]["status"]["phase"] == "Queued"


def test_a_staging_failure_puts_its_message_in_the_status(sims: FakeSims, tmp_path: Path) -> None:
    from rankpack.controller.loop import Job

    sims.add("a")
    q = _queue(sims, tmp_path)
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
    q = _queue(sims, tmp_path)
    (job,) = q.pending()
    q.finished(job, "failed", "nosuchcase: no system/controlDict", FailureCode.NOT_A_CASE)
    st = sims.objs["a"]["status"]
    failed = {c["type"]: c for c in st["conditions"]}["Failed"]
    assert st["reason"] == failed["reason"] == st["result"]["reason"] == "NotACase"


@pytest.mark.parametrize(
    ("failure", "code"),
    [("PodDeleted", FailureCode.POD_DELETED), ("OOMKilled", FailureCode.OOM_KILLED),
     (None, FailureCode.OTHER), ("NoSuchCode", FailureCode.OTHER)],
)  # fmt: skip
def test_a_runs_code_is_read_from_its_row(failure: str | None, code: FailureCode) -> None:
    class Row:  # the store's run row: `RunResult.failure` as recorded
        def __init__(self, failure: str | None) -> None:
            self.failure = failure

    assert queue._failure_code(Row(failure)) is code


def test_a_held_head_says_why_in_its_queued_condition(sims: FakeSims, tmp_path: Path) -> None:
    sims.add("a")
    q = _queue(sims, tmp_path)
    (job,) = q.pending()
    q.held(job, "quota", "queued simulation 1 needs 1000m ... held within the ResourceQuota q")
    queued = {c["type"]: c for c in sims.objs["a"]["status"]["conditions"]}["Queued"]
    assert (queued["status"], queued["reason"]) == ("True", "QuotaExceeded")
    assert "ResourceQuota q" in queued["message"]
    assert sims.objs["a"]["status"]["phase"] == "Queued"


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
def test_cpu_quota_reads_requests_cpu(quota: Obj, want: tuple[int, int] | None) -> None:
    from rankpack.backend.kubernetes.objects.status import cpu_quota

    assert cpu_quota(quota) == want


def test_a_claimed_simulation_deleted_or_created_again_is_withdrawn(
    sims: FakeSims, tmp_path: Path
) -> None:
    sims.add("a")
    sims.add("b")
    sims.add("c")
    q = _queue(sims, tmp_path)
    jobs = {q.names[j.queue_id]: j for j in q.pending()}
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
    assert jobs["b"].queue_id not in q.names and "b" not in q.ids
    sims.objs["b"]["status"] = {}
    (again,) = [j for j in q.pending() if q.names[j.queue_id] == "b"]
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
    q = _queue(sims, tmp_path)
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
    q2 = queue.SimulationQueue(sims, q_store(tmp_path), "op-2")  # type: ignore[arg-type]
    (again,) = q2.pending()
    assert again.resume == resume
    assert q2.claim(again)
    at = replace(staged, resumed_from="120", start_iterations=120)
    q2.started(again, 2, "s2", at)
    st = sims.objs["a"]["status"]
    assert "resume" not in st and st["staged"]["startIterations"] == 120
    assert st["nodeLost"]["resumedFrom"] == "120" and st["nodeLost"]["iterationsLost"] == 17
    assert queue.staged_from_json(st["staged"]) == at  # an adopter counts on from 120
