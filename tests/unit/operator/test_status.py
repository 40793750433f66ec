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
