"""Serving several namespaces (issue 26, item 7): the admin's layout (`Tenancy`), and the
operator's queue over the real `SimulationApi` on the fake apiserver (`FakeKubeApi`) holding
two namespaces. A Simulation is known by ``namespace/name``; its job names its namespace and
that namespace's run directories and volume; it is admitted against its own namespace's case
roots; its status and its Events are written in its namespace only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankpack.core.failures import FailureCode
from rankpack.errors import UserError
from rankpack.operator import adoption, crd, events, queue, simapi
from rankpack.operator.admission import AdmissionPolicy, NamespaceLimits
from rankpack.operator.tenancy import FIELD, Tenancy, parse_namespaces
from rankpack.store import EventRow
from tests.fakeapi import FakeKubeApi

Obj = dict[str, Any]
A, B = "team-a", "team-b"
ROOT = "/var/lib/rankpack/namespaces/{namespace}"
LAYOUT = Tenancy((A, B), f"{ROOT}/runs", f"pvc:rankpack-runs:{ROOT}")
POLICY = AdmissionPolicy(case_roots=(f"{ROOT}/cases",))


# -- the admin's layout -------------------------------------------------------------------------


def test_namespaces_are_repeated_or_comma_lists_without_repeats() -> None:
    assert parse_namespaces(["a", "b,c", " c , d", ""]) == ("a", "b", "c", "d")
    assert parse_namespaces([]) == ()
    with pytest.raises(UserError, match="'Team' is not a namespace name"):
        parse_namespaces(["a,Team"])


def test_each_namespace_gets_its_own_run_directories_and_volume() -> None:
    assert LAYOUT.runs_root_of(A) == Path("/var/lib/rankpack/namespaces/team-a/runs")
    assert LAYOUT.volume_of(B) == "pvc:rankpack-runs:/var/lib/rankpack/namespaces/team-b"
    LAYOUT.check(POLICY)
    mine = LAYOUT.admission_of(POLICY, A)
    assert mine.case_roots == ("/var/lib/rankpack/namespaces/team-a/cases",)
    # one namespace as today: nothing to name, nothing changes
    today = Tenancy(("rankpack",), "/var/lib/rankpack/runs", "pvc:rankpack-runs:/var/lib/rankpack")
    plain = AdmissionPolicy(case_roots=("/var/lib/rankpack/cases",))
    today.check(plain)
    assert today.admission_of(plain, "rankpack") is plain


@pytest.mark.parametrize(
    ("layout", "policy", "why"),
    [
        (Tenancy((A, B), "/runs", None), AdmissionPolicy(), "--runs-root /runs would be shared"),
        (Tenancy((A, B), f"{ROOT}/runs", "pvc:c:/var/lib/rankpack"), AdmissionPolicy(),
         "--volume pvc:c:/var/lib/rankpack would be shared"),
        (Tenancy((A, B), f"{ROOT}/runs", "host:/data"), AdmissionPolicy(), "--volume host:/data"),
        (LAYOUT, AdmissionPolicy(case_roots=("/cases",)), "--case-root /cases would be shared"),
        (LAYOUT, AdmissionPolicy(host_prefixes=("/data",)), "--allow-host-path /data"),
        (Tenancy((A,), f"{ROOT}/runs", "pvc:c:/elsewhere/{namespace}"), AdmissionPolicy(),
         "the run directories of namespace team-a .* are not inside its rank pods' volume"),
        (Tenancy((A,), "runs", None), AdmissionPolicy(), "must be an absolute directory"),
    ],
)  # fmt: skip
def test_a_layout_that_would_share_files_between_namespaces_is_refused(
    layout: Tenancy, policy: AdmissionPolicy, why: str
) -> None:
    with pytest.raises(UserError, match=why):
        layout.check(policy)


def test_a_claim_mounted_at_the_runs_root_is_per_namespace_by_itself() -> None:
    Tenancy((A, B), f"{ROOT}/runs", "pvc:rankpack-runs").check(POLICY)
    Tenancy((A, B), f"{ROOT}/runs", None).check(POLICY)  # each run directory a host path


# -- the queue over two namespaces ---------------------------------------------------------------


def status(rest: FakeKubeApi, ns: str, name: str) -> Obj:
    return dict(rest.simulations[ns][name].get("status") or {})


def tenant_queue(rest: FakeKubeApi, tmp_path: Path, **limits: Any) -> queue.SimulationQueue:
    api = simapi.SimulationApi(rest, (A, B))  # type: ignore[arg-type]
    return queue.SimulationQueue(api, "op-1", admission=POLICY,
                                 limits=NamespaceLimits(**limits), tenancy=LAYOUT)  # fmt: skip


def test_the_same_name_in_two_namespaces_is_two_simulations(tmp_path: Path) -> None:
    rest = FakeKubeApi()
    rest.add_simulation(A, "pitz")
    rest.add_simulation(B, "pitz")
    q = tenant_queue(rest, tmp_path)
    jobs = q.pending()
    assert [q.index.names[j.queue_id] for j in jobs] == [f"{A}/pitz", f"{B}/pitz"]
    ja, jb = jobs
    assert ja.namespace == A
    assert (jb.namespace, jb.runs_root, jb.volume) == (
        B, Path("/var/lib/rankpack/namespaces/team-b/runs"),
        "pvc:rankpack-runs:/var/lib/rankpack/namespaces/team-b",
    )  # fmt: skip
    assert q.claim(jb)
    assert status(rest, B, "pitz")["phase"] == "Starting"
    assert status(rest, A, "pitz")["phase"] == "Queued"
    q.finished(jb, "failed", "it broke", FailureCode.STAGE_FAILED)
    assert status(rest, B, "pitz")["phase"] == "Failed"
    assert status(rest, A, "pitz")["phase"] == "Queued"
    # every write went to its own namespace's object
    writes = {path for method, path, _ in rest.sent if method not in ("GET", "WATCH")}
    assert writes == {f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{ns}/{crd.PLURAL}/pitz/status"
                      for ns in (A, B)}  # fmt: skip


def test_a_case_path_is_admitted_against_its_own_namespaces_root_only(tmp_path: Path) -> None:
    rest = FakeKubeApi()
    rest.add_simulation(A, "mine", "/var/lib/rankpack/namespaces/team-a/cases/pitz")
    rest.add_simulation(A, "theirs", "/var/lib/rankpack/namespaces/team-b/cases/pitz")
    rest.add_simulation(
        A, "climb", "/var/lib/rankpack/namespaces/team-a/cases/../../team-b/cases/pitz"
    )
    q = tenant_queue(rest, tmp_path)
    assert [q.index.names[j.queue_id] for j in q.pending()] == [f"{A}/mine"]
    for name in ("theirs", "climb"):
        st = status(rest, A, name)
        assert (st["phase"], st["reason"]) == ("Failed", "CasePathNotAllowed"), st
    assert "/var/lib/rankpack/namespaces/team-a/cases" in status(rest, A, "theirs")["message"]


def test_limits_count_per_namespace_across_namespaces(tmp_path: Path) -> None:
    rest = FakeKubeApi()
    for ns in (A, B):
        rest.add_simulation(ns, "one")
    rest.add_simulation(A, "two")
    q = tenant_queue(rest, tmp_path, max_queued=1)
    assert [q.index.names[j.queue_id] for j in q.pending()] == [f"{A}/one", f"{B}/one"]
    st = status(rest, A, "two")
    assert (st["phase"], st["reason"]) == ("Failed", "TooManyQueued")
    assert "namespace team-a already has 1" in st["message"]


def test_a_deleted_simulation_withdraws_only_its_own(tmp_path: Path) -> None:
    rest = FakeKubeApi()
    rest.add_simulation(A, "pitz")
    rest.add_simulation(B, "pitz")
    q = tenant_queue(rest, tmp_path)
    ja, jb = q.pending()
    assert q.claim(ja) and q.claim(jb)
    del rest.simulations[A]["pitz"]
    q.pending()
    assert q.withdrawn() == {ja.queue_id}


def test_adoption_hands_back_each_simulations_namespace(tmp_path: Path) -> None:
    rest = FakeKubeApi()
    rest.add_simulation(B, "pitz")
    staged = {"runDir": "/var/lib/rankpack/namespaces/team-b/runs/r", "caseName": "pitzDaily",
              "caseSource": "tutorial", "solver": "simpleFoam", "cellsPerRank": [1, 1],
              "expectedIterations": 10}  # fmt: skip
    rest.simulations[B]["pitz"]["status"] = {"phase": "Running", "simId": "s1", "staged": staged}
    found = adoption.running(tenant_queue(rest, tmp_path))
    assert found is not None
    ((adopted),) = found
    assert (adopted.job.namespace, adopted.sim_id) == (B, "s1")


def test_a_namespace_that_does_not_answer_is_no_listing_at_all(tmp_path: Path) -> None:
    rest = FakeKubeApi()
    rest.add_simulation(A, "pitz")
    rest.forbid_paths.add(f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{B}/{crd.PLURAL}")
    q = tenant_queue(rest, tmp_path)
    assert q.pending() == [] and not q.idle()  # never mistaken for an empty namespace


def test_events_are_posted_in_their_simulations_namespace() -> None:
    posted: list[Obj] = []
    names = {1: f"{B}/pitz", 2: "plain"}
    ev = events.SimulationEvents(posted.append, A, "op-1",
                                 name_of=lambda e: names[int(e.detail["queue_id"])],
                                 uid_of=lambda key: f"uid-{key}")  # fmt: skip
    for qid in (1, 2):
        ev.add([EventRow(qid, None, "t", 1.0, "finished", {"queue_id": qid, "status": "failed",
                                                             "reason": "x"}, 3)])  # fmt: skip
    bodies = list(ev.queue)
    assert [(b["metadata"]["namespace"], b["involvedObject"]["name"],
             b["involvedObject"]["uid"]) for b in bodies] == [
        (B, "pitz", f"uid-{B}/pitz"), (A, "plain", "uid-plain")]  # fmt: skip


def test_the_field_is_spelled_as_documented() -> None:
    assert FIELD == "{namespace}"
