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


def _busy(i: int, duty: float | None, node: str, millis: int = 500) -> RankView:
    return RankView(rank=i, request_millis=millis, limit_millis=None, cpu_cores=0.9,
                    nr_throttled=0, duty=duty, node=node)  # fmt: skip


def test_the_status_shows_duty_efficiency_nodes_and_checked_residuals() -> None:
    """Issue 42: a glance at a running Simulation (`report.glance`), in its status."""
    log = LogState(iterations=40, residuals={"Ux": 1.5e-3, "p": 0.0421, "k": float("nan"),
                                             "$(evil)": 1.0, "x" * 200: 1.0})  # fmt: skip
    view = SimView(sim_id="s1", run_id=1, run_dir=None, case="pitzDaily", stage="running",
                   elapsed_s=30.0, log=log, expected_iterations=100,
                   ranks=(_busy(0, 0.2, "n2", 250), _busy(1, 0.9, "n1", 1750),
                          _busy(2, None, "n1")))  # fmt: skip
    st = StatusWriter._status(view)
    assert st["duty"] == {"mean": 0.55, "min": 0.2}
    # solver work (0.2 + 0.9 cores) over what those ranks request (0.25 + 1.75 cores)
    assert st["efficiency"] == 0.55
    assert st["nodes"] == "n1,n2"
    assert st["residuals"] == {"Ux": 0.0015, "p": 0.0421}  # no NaN, no odd names
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert {"duty", "efficiency", "nodes", "residuals", "eta"} <= set(
        schema["properties"]["status"]["properties"])  # fmt: skip


def test_no_duty_yet_shows_none_of_duty_and_efficiency() -> None:
    view = SimView(sim_id="s1", run_id=1, run_dir=None, case="pitzDaily", stage="running",
                   elapsed_s=3.0, log=LogState(), expected_iterations=10,
                   ranks=(rank(0, "n1"),))  # fmt: skip
    st = StatusWriter._status(view)
    assert "duty" not in st and "efficiency" not in st and "residuals" not in st


def test_the_eta_is_an_absolute_time_at_the_recent_rate() -> None:
    from pathlib import Path

    from rankpack.case.staging import StagedCase
    from tests.fakeapi import FakeSims
    from tests.unit.operator._helpers import new_queue

    sims = FakeSims()
    sims.add("a")
    q = new_queue(sims)
    (job,) = q.pending()
    assert q.claim(job)
    q.started(job, 7, "s1", StagedCase(Path("/runs/a"), "pitzDaily", "t", "simpleFoam",
                                       (1, 1), 1000))  # fmt: skip
    writer = StatusWriter(q, interval_s=0.0)
    clock = [1_800_000_000.0]
    writer.wall = lambda: clock[0]

    def write(iterations: int) -> dict[str, object]:
        view = SimView(sim_id="s1", run_id=7, run_dir=None, case="pitzDaily", stage="running",
                       elapsed_s=1.0, log=LogState(iterations=iterations),
                       expected_iterations=1000, ranks=(), queue_id=job.queue_id,
                       running=True)  # fmt: skip
        writer.update(0.0, [view])
        q.flush()
        status: dict[str, object] = sims.objs["a"]["status"]
        return status

    assert "eta" not in write(100)  # one mark: no rate yet
    clock[0] += 10
    st = write(120)  # 2 iterations a second, 880 left: 440 s from now
    assert st["eta"] == "2027-01-15T08:07:30Z"  # 1 800 000 010 + 440 = 1 800 000 450


def test_glance_eta_rate_and_edges() -> None:
    from rankpack.report.glance import eta_s

    assert eta_s([], 100) is None
    assert eta_s([(0.0, 10)], 100) is None
    assert eta_s([(0.0, 10), (10.0, 10)], 100) is None  # no progress: no rate
    assert eta_s([(0.0, 10), (10.0, 30)], 100) == 35.0
    assert eta_s([(0.0, 10), (10.0, 100)], 100) == 0.0
