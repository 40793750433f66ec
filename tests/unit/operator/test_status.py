"""A Simulation's status names each rank's node (issue 28), and its CRD schema allows it."""

from __future__ import annotations

from rankpack.case.foamlog import LogState
from rankpack.controller.views import RankView, SimView
from rankpack.operator.crd import crd_manifest
from rankpack.operator.status import StatusWriter


def rank(i: int, node: str | None) -> RankView:
    return RankView(rank=i, request_millis=500, limit_millis=None, cpu_cores=0.4,
                    nr_throttled=0, duty=None, node=node)  # fmt: skip


def test_the_status_names_each_ranks_node_once_it_is_bound() -> None:
    view = SimView(sim_id="s1", run_id=1, run_dir=None, case="pitzDaily", stage="running",
                   elapsed_s=3.0, log=LogState(), expected_iterations=10,
                   ranks=(rank(0, "rankpack-node"), rank(1, None)))  # fmt: skip
    ranks = StatusWriter._status(view)["ranks"]
    assert [r.get("node") for r in ranks] == ["rankpack-node", None]
    versions = crd_manifest()["spec"]["versions"]
    status = versions[0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["properties"]["ranks"]["items"]["properties"]["node"]["type"] == "string"


def test_a_claimed_simulation_is_starting_until_every_rank_runs() -> None:
    """Issue 40: ``Starting`` from the claim; ``Running`` once every rank runs, written once
    and at once; a relaunch (a new sim id) starts again."""
    from pathlib import Path

    from rankpack.case.staging import StagedCase
    from tests.fakeapi import FakeSims
    from tests.unit.operator._helpers import new_queue

    sims = FakeSims()
    sims.add("a")
    q = new_queue(sims)
    (job,) = q.pending()
    assert q.claim(job)
    st = sims.objs["a"]["status"]
    assert st["phase"] == "Starting"
    assert {c["type"]: c["status"] for c in st["conditions"]}["Running"] == "False"
    staged = StagedCase(Path("/runs/a"), "pitzDaily", "tutorial", "simpleFoam", (1, 1), 100)
    q.started(job, 7, "s1", staged)
    assert sims.objs["a"]["status"]["phase"] == "Starting"  # launched: its pods start
    writer = StatusWriter(q, interval_s=3600.0)

    def view(sim_id: str, running: bool) -> SimView:
        return SimView(sim_id=sim_id, run_id=7, run_dir=None, case="pitzDaily", stage="starting",
                       elapsed_s=1.0, log=LogState(), expected_iterations=100, ranks=(),
                       queue_id=job.queue_id, running=running)  # fmt: skip

    writer.update(1.0, [view("s1", running=False)])
    assert sims.objs["a"]["status"]["phase"] == "Starting"
    writer.update(2.0, [view("s1", running=True)])
    st = sims.objs["a"]["status"]
    assert st["phase"] == "Running"  # at once, not at the next 3600 s interval
    running = {c["type"]: c for c in st["conditions"]}["Running"]
    assert (running["status"], running["reason"]) == ("True", "RanksRunning")
    writes = len(sims.patches)
    writer.update(3.0, [view("s1", running=True)])
    assert len(sims.patches) == writes  # once
    crd_phases = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["status"]["properties"]["phase"]["enum"]  # fmt: skip
    assert crd_phases == ["Queued", "Starting", "Running", "Succeeded", "Failed"]
