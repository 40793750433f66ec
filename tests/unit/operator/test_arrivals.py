"""Admission at arrival (`Arrivals`): a Simulation the admin's policy refuses ends Failed with
its reason the first time a listing shows it, and is never a job. Against `FakeSims`."""

from __future__ import annotations

from pathlib import Path

from rankpack.operator import queue
from tests.fakeapi import FakeSims


def test_a_refused_spec_ends_failed_with_its_reason_and_is_never_a_job(
    tmp_path: Path,
) -> None:
    sims = FakeSims()
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
        sims, "op-1",  # type: ignore[arg-type]
        admission=policy, cluster_millis=lambda: 2000,
    )  # fmt: skip
    assert [q.index.names[j.queue_id] for j in q.pending()] == ["ok"]
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
