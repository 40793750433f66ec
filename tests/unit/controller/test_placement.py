"""Placement across nodes (issue 28): the decision step gives each rank of a launch a node
(`room.place`, carried by `StageJob.nodes`); a simulation spans nodes only when it must,
simulations pack onto a node when they fit, and a grow its rank's node cannot hold waits
(`pacing`, code ``node-full``) instead of being sent to be deferred or refused. Pure tests
with a fake clock, then the loop on the simulated cluster of two nodes (virtual time)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rankpack.controller import waits
from rankpack.controller.decision import (
    ControllerSettings,
    ControllerState,
    NodeCores,
    Observations,
    RankSnapshot,
    SimMemory,
    SimSnapshot,
)
from rankpack.controller.jobs import OneJob
from rankpack.controller.loop import run_jobs
from rankpack.controller.policy import decide
from rankpack.controller.room import place
from rankpack.controller.tracked import LoopSettings
from rankpack.core.actions import Note, Resize
from rankpack.plan.submission import Phase, Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

from ._helpers import launches, observe, queued, running_on

S = ControllerSettings(max_concurrent=10, launch_must_fit=True)

# -- the rule -----------------------------------------------------------------------------


def test_a_simulation_that_fits_one_node_goes_to_the_fullest_node_that_holds_it() -> None:
    nodes = [("n0", 8000), ("n1", 3000), ("n2", 5000)]
    assert place([1000, 1000], nodes) == ("n1", "n1")  # least room that holds all: packs
    assert place([2000, 2000], nodes) == ("n2", "n2")
    assert place([1000] * 8, nodes) == ("n0",) * 8
    assert place([1000], [("a", 1000), ("b", 1000)]) == ("a",)  # ties: the first


def test_a_simulation_spans_nodes_only_when_it_must_and_balances_its_ranks() -> None:
    # the issue's 4 ranks of weights 1,1,3,3 and budget 1.6 on two 1-core nodes: each node
    # gets one heavy and one light rank (800m each), so both phases of 400m each fit too
    assert place([200, 200, 600, 600], [("n0", 1000), ("n1", 1000)]) == ("n0", "n1", "n0", "n1")
    # the fewest nodes: the two with the most room, not a third
    spread = place([3000] * 4, [("n0", 8000), ("n1", 2000), ("n2", 8000)])
    assert spread is not None and sorted(spread) == ["n0", "n0", "n2", "n2"]
    # never more nodes than ranks; nothing when a rank fits no node or the sum no nodes
    assert place([1500, 100], [("n0", 1000), ("n1", 1000)]) is None
    assert place([900, 900, 900], [("n0", 1000), ("n1", 1000)]) is None
    assert place([], [("n0", 1000)]) is None and place([1], []) is None


def test_balancing_falls_back_to_first_fit_when_it_must() -> None:
    # most-room-first puts 500 and 400 on different nodes and then 600 fits neither;
    # first fit on the same two nodes finds 600+400 | 500+500
    found = place([600, 500, 500, 400], [("n0", 1000), ("n1", 1000)])
    assert found is not None
    load = {n: sum(r for r, m in zip([600, 500, 500, 400], found, strict=True) if m == n)
            for n in ("n0", "n1")}  # fmt: skip
    assert sorted(load.values()) == [1000, 1000]


# -- the decision step: StageJob.nodes --------------------------------------------------------


def free_nodes(*free: tuple[str, int, int]) -> tuple[NodeCores, ...]:
    """(name, allocatable, this loop's millicores there)."""
    return tuple(NodeCores(n, a, ours_ranks=o // 1000, ours_millis=o) for n, a, o in free)


def test_a_launch_names_a_node_per_rank_on_a_cluster_and_none_on_one_node() -> None:
    two = free_nodes(("n0", 2000, 0), ("n1", 2000, 0))
    d = decide(observe(0.0, queue=[queued(1, 2)], nodes=two), ControllerState(), S)
    assert [a.nodes for a in launches(d)] == [("n0", "n0")]  # fits one node: stays there
    d = decide(observe(0.0, queue=[queued(1, 4, 800)], nodes=two), ControllerState(), S)
    assert [sorted(a.nodes) for a in launches(d)] == [["n0", "n0", "n1", "n1"]]  # must span
    one = free_nodes(("n0", 4000, 0))
    d = decide(observe(0.0, queue=[queued(1, 2)], nodes=one), ControllerState(), S)
    assert [a.nodes for a in launches(d)] == [()]  # one node: the scheduler's


def test_simulations_pack_onto_a_node_while_they_fit() -> None:
    # a sized 4-rank simulation on n0 (8 cores), n1 empty: the next 4-rank one goes beside
    # it on n0, leaving n1 whole for a wide one
    nodes = free_nodes(("n0", 8000, 4000), ("n1", 8000, 0))
    sim = running_on("a", "n0", 4)
    state = ControllerState(sims={"a": SimMemory(stage="sized", duty=(0.5,) * 4)})
    d = decide(observe(10.0, sim, queue=[queued(1, 4)], nodes=nodes), state, S)
    assert [a.nodes for a in launches(d)] == [("n0",) * 4]
    # the pipeline places each launch of a step after the ones before it in that step
    two = free_nodes(("n0", 8000, 0), ("n1", 8000, 0))
    queue = [queued(1, 4), queued(2, 4), queued(3, 8)]
    d = decide(observe(0.0, queue=queue, nodes=two), ControllerState(), S)
    assert [a.nodes for a in launches(d)] == [("n0",) * 4, ("n0",) * 4, ("n1",) * 8]


# -- a grow the node cannot hold -------------------------------------------------------------

PHASES = (Phase(0.0, (500, 500)), Phase(0.5, (200, 1000)))


def scheduled(requests: tuple[int, int], node: str = "n0") -> SimSnapshot:
    return SimSnapshot(
        sim_id="a", started_s=0.0, iterations=60, expected_iterations=100,
        budget_millis=1200, phases=PHASES,
        ranks=tuple(RankSnapshot(i, m, 0, 0, 0, node=node) for i, m in enumerate(requests)),
    )  # fmt: skip


def two_node_cores(ours: int, others: int) -> tuple[NodeCores, ...]:
    return (
        NodeCores("n0", 1200, others_millis=others, ours_ranks=2, ours_millis=ours),
        NodeCores("n1", 1000, ours_ranks=0, ours_millis=0),
    )


def test_a_grow_its_node_cannot_hold_is_held_and_said_once_then_sent_when_it_fits() -> None:
    state = ControllerState(sims={"a": SimMemory(stage="scheduled", phase_index=0)})
    sim = scheduled((500, 500))
    # n0: 1200m, another pod 200m, the two ranks 1000m: the shrink to 200m frees 300m,
    # the grow to 1000m needs 500m more: held, though the cluster has 1000m free on n1
    obs = Observations(now_s=10.0, capacity_millis=2000, sims=(sim,), queue=(),
                       nodes=two_node_cores(1000, 200), others_millis=200)  # fmt: skip
    d = decide(obs, state, S)
    resizes = [a for a in d.actions if isinstance(a, Resize)]
    assert [(a.rank, a.request_millis) for a in resizes] == [(0, 200)]
    (held,) = [a for a in d.actions if isinstance(a, Note) and a.kind == "resize-held"]
    assert held.code == "node-full" and held.sim_id == "a"
    assert "does not fit node n0 (300m of its 1200m unrequested" in held.reason
    assert [(a.rank, a.request_millis) for a in d.state.resize_queue] == [(1, 1000)]
    # the shrink done, the other pod still there: still held, not said again
    sim = scheduled((200, 500))
    obs = Observations(now_s=11.0, capacity_millis=2000, sims=(sim,), queue=(),
                       nodes=two_node_cores(700, 200), others_millis=200)  # fmt: skip
    d2 = decide(obs, d.state, S)
    assert not [a for a in d2.actions if isinstance(a, Resize | Note)]
    assert [(a.rank, a.request_millis) for a in d2.state.resize_queue] == [(1, 1000)]
    # the other pod left: the node holds it now
    obs = Observations(now_s=12.0, capacity_millis=2200, sims=(sim,), queue=(),
                       nodes=two_node_cores(700, 0))  # fmt: skip
    d3 = decide(obs, d2.state, S)
    assert [(a.rank, a.request_millis) for a in d3.actions if isinstance(a, Resize)] == [(1, 1000)]
    assert d3.state.resize_queue == ()


def test_a_trade_between_ranks_of_one_node_that_fits_is_sent_at_once() -> None:
    state = ControllerState(sims={"a": SimMemory(stage="scheduled", phase_index=0)})
    obs = Observations(now_s=10.0, capacity_millis=2200, sims=(scheduled((500, 500)),),
                       queue=(), nodes=two_node_cores(1000, 0))  # fmt: skip
    d = decide(obs, state, S)
    assert [(a.rank, a.request_millis) for a in d.actions if isinstance(a, Resize)] == [
        (0, 200), (1, 1000)]  # fmt: skip
    assert d.state.resize_queue == ()
    assert not [a for a in d.actions if isinstance(a, Note) and a.code == "node-full"]


# -- the loop on the simulated cluster of two nodes ------------------------------------------

CASE = SimulatedCase("box", cells=8000, iterations=100, cell_work_s=1e-4)


def _run_placed(tmp_path: Path, sub: Submission, *nodes: SimNode) -> tuple[object, Store]:
    store = Store(tmp_path / "r.db")
    backend = SimulatedBackend(SimulatedCluster(nodes=nodes, cases=(CASE,)))
    settings = LoopSettings(runs_root=tmp_path / "runs", controller=S, shim=True)
    return run_jobs(backend, store, OneJob(sub), settings), store


def test_the_issues_run_spans_two_nodes_and_every_phase_resize_completes(tmp_path: Path) -> None:
    sub = Submission(
        case="box", weights=(1.0, 1.0, 3.0, 3.0), budget_millis=1600, sizing="fixed",
        phases=(Phase(0.0, (200, 200, 600, 600)), Phase(0.5, (400, 400, 400, 400))),
    )  # fmt: skip
    result, store = _run_placed(tmp_path, sub, SimNode("n0", 1000), SimNode("n1", 1000))
    (run,) = result.results  # type: ignore[attr-defined]
    assert run.status == "completed" and run.restarts == 0
    assert [r.node for r in run.ranks] == ["n0", "n1", "n0", "n1"]
    assert sorted((r.rank, r.to_millis, r.status) for r in run.resizes) == [
        (0, 400, "completed"), (1, 400, "completed"), (2, 400, "completed"),
        (3, 400, "completed"),
    ]  # fmt: skip
    (stage,) = [e for e in store.events() if e.kind == "stage"]
    assert stage.detail["nodes"] == ["n0", "n1", "n0", "n1"]
    assert not [e for e in store.events() if e.detail.get("code") == "node-full"]


def test_the_loop_holds_a_grow_its_node_cannot_hold_and_the_run_completes(
    tmp_path: Path,
) -> None:
    sub = Submission(case="box", weights=(1.0, 1.0), budget_millis=1200, sizing="fixed",
                     phases=PHASES)  # fmt: skip
    result, store = _run_placed(tmp_path, sub, SimNode("n0", 1000), SimNode("n1", 1000))
    (run,) = result.results  # type: ignore[attr-defined]
    assert run.status == "completed" and [r.node for r in run.ranks] == ["n0", "n0"]
    # the shrink completed; the grow to 1000m never fits n0 beside 200m: held, never sent
    assert [(r.rank, r.to_millis, r.status) for r in run.resizes] == [(0, 200, "completed")]
    held = [e for e in store.events() if e.kind == "resize-held"]
    assert [e.detail.get("code") for e in held] == ["node-full"]
    assert not [e for e in store.events() if e.kind in ("resize-rejected", "resize-infeasible")]


def test_one_node_decides_no_node(tmp_path: Path) -> None:
    sub = Submission(case="box", weights=(1.0, 1.0), budget_millis=1000, sizing="fixed")
    result, store = _run_placed(tmp_path, sub, SimNode("n0", 2000))
    (run,) = result.results  # type: ignore[attr-defined]
    assert run.status == "completed" and [r.node for r in run.ranks] == ["n0", "n0"]
    (stage,) = [e for e in store.events() if e.kind == "stage"]
    assert "nodes" not in stage.detail


def test_the_wait_rule_at_launch_counts_placed_ranks_on_their_node_once() -> None:
    # the observations count the launch's 2 ranks on n0 already (its planned nodes)
    nodes = (NodeCores("n0", 2000, ours_ranks=2, ours_millis=1000),
             NodeCores("n1", 2000, ours_ranks=0, ours_millis=0))  # fmt: skip
    obs = Observations(now_s=0.0, capacity_millis=4000, sims=(), queue=(), nodes=nodes)
    choice = waits.at_launch(obs, "auto", (500, 500), ("n0", "n0"))
    assert choice.mode == "spin" and [r.node for r in choice.ranks] == ["n0", "n0"]
    assert "2 ranks on the 2 cores of node n0" in choice.reason
    # with a third rank of another simulation there, the node is crowded
    crowded = (replace(nodes[0], other_ranks=1), nodes[1])
    choice = waits.at_launch(replace(obs, nodes=crowded), "auto", (500, 500), ("n0", "n0"))
    assert choice.mode == "polite" and "3 ranks on the 2 cores of node n0" in choice.reason
