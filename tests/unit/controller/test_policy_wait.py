"""(E) of the decision step: under ``wait="auto"`` a simulation spins while each of its ranks
has a core to itself and waits politely where ranks outnumber a node's cores (issue 24); a
switch is emitted only on change.

The clock is fake: it is only the ``now_s`` passed in the observations.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rankpack.controller import waits
from rankpack.controller.decision import (
    ControllerSettings,
    ControllerState,
    Decision,
    NodeCores,
    QueuedSim,
    SimMemory,
    SimSnapshot,
)
from rankpack.controller.policy import decide
from rankpack.core.actions import Launch, SetWaitMode

from ._helpers import SIZED, S, observe, snap, state_of

FIXED = SimMemory(stage="fixed")


def auto(sim_id: str = "a", requests: tuple[int, ...] = (1000, 1000), **kw: object) -> SimSnapshot:
    return replace(snap(sim_id, requests), wait="auto", **kw)  # type: ignore[arg-type]


def switches(d: Decision) -> list[tuple[str, str]]:
    return [(a.sim_id, a.mode) for a in d.actions if isinstance(a, SetWaitMode)]


def test_alone_within_capacity_stays_in_its_launch_mode_spin() -> None:
    d = decide(observe(0.0, auto(), capacity=2000), state_of(a=FIXED), S)
    assert switches(d) == []
    assert d.state.sims["a"].wait_mode is None  # still the launch mode (spin)


def test_ranks_that_outnumber_the_cores_wait_politely_and_spin_again_when_they_do_not() -> None:
    a, b = auto("a", (500, 500)), auto("b", (500, 500))
    d1 = decide(observe(0.0, a, b, capacity=2000), state_of(a=FIXED, b=FIXED), S)
    assert sorted(switches(d1)) == [("a", "polite"), ("b", "polite")]
    reason = next(x.reason for x in d1.actions if isinstance(x, SetWaitMode) and x.sim_id == "a")
    assert "ranks outnumber cores: 4 ranks on the 2 cores" in reason
    assert "spin -> polite" in reason
    # next step, same picture: nothing is emitted again (memory holds the mode)
    d2 = decide(observe(1.0, a, b, capacity=2000), d1.state, S)
    assert switches(d2) == []
    # b ended: a's 2 ranks have the 2 cores to themselves and spin again, once
    d3 = decide(observe(2.0, a, capacity=2000), d2.state, S)
    assert switches(d3) == [("a", "spin")]
    assert "every rank has a core to itself: 2 ranks on the 2 cores" in next(
        x.reason for x in d3.actions if isinstance(x, SetWaitMode)
    )
    assert switches(decide(observe(3.0, a, capacity=2000), d3.state, S)) == []


def test_two_simulations_whose_ranks_each_have_a_core_spin() -> None:
    a, b = auto("a", (500, 500)), auto("b", (500, 500))
    d = decide(observe(0.0, a, b, capacity=4000), state_of(a=FIXED, b=FIXED), S)
    assert switches(d) == []


def test_a_staging_neighbour_counts_its_ranks_but_is_not_switched_itself() -> None:
    staging = replace(auto("b"), starting=True, ranks=auto("b").ranks)
    d = decide(observe(0.0, auto("a", (500, 500)), staging, capacity=3000),
               state_of(a=FIXED), S)  # fmt: skip
    assert switches(d) == [("a", "polite")]
    # with a core per rank, the neighbour changes nothing
    d = decide(observe(0.0, auto("a", (500, 500)), staging, capacity=4000),
               state_of(a=FIXED), S)  # fmt: skip
    assert switches(d) == []


def test_a_launch_in_this_step_counts_the_ranks_being_launched() -> None:
    queued = QueuedSim(queue_id=3, n_ranks=2, initial_request_millis=(500, 500))
    obs = observe(10.0, auto("a", (500, 500)), queue=[queued], capacity=3000)
    settings = ControllerSettings(min_predicted_gain=-1.0)
    d = decide(obs, state_of(a=SIZED), settings)
    assert any(type(x).__name__ == "StageJob" for x in d.actions)
    assert switches(d) == [("a", "polite")]
    assert "4 ranks on the 3 cores" in next(
        x.reason for x in d.actions if isinstance(x, SetWaitMode)
    )


def test_requests_above_the_capacity_left_to_rankpack_mean_sharing() -> None:
    # other pods/cgroups took part of the node: 2000m requested on 1500m left
    d = decide(observe(0.0, auto(), capacity=1500, others=500), state_of(a=FIXED), S)
    assert switches(d) == [("a", "polite")]
    assert "exceed" in d.actions[0].reason  # type: ignore[union-attr]


@pytest.mark.parametrize("request_millis", [1000, 500, 250])
def test_one_simulation_with_more_ranks_than_cores_waits_politely(request_millis: int) -> None:
    # issue 24: `rankpack run pitzDaily --ranks 4` on 2 cores, nothing else on the node.
    # Its ranks spin against each other (on Kubernetes 75x slower than polite waits).
    obs = observe(0.0, auto("a", (request_millis,) * 4), capacity=2000)
    d = decide(obs, state_of(a=FIXED), S)
    assert switches(d) == [("a", "polite")]
    (action,) = (a for a in d.actions if isinstance(a, SetWaitMode))
    assert [(r.rank, r.mode) for r in action.ranks] == [(i, "polite") for i in range(4)]
    assert all("4 ranks on the 2 cores" in r.why for r in action.ranks)
    assert switches(decide(replace(obs, now_s=1.0), d.state, S)) == []


def test_the_mode_the_ranks_were_launched_in_is_what_the_rule_compares_with() -> None:
    # launched polite (the loop knows), memory fresh: alone with a core per rank -> spin
    a = replace(auto("a", (500, 500)), wait_mode="polite")
    d = decide(observe(0.0, a, capacity=2000), ControllerState(), S)
    assert switches(d) == [("a", "spin")]


def _on(sim: SimSnapshot, *nodes: str | None) -> SimSnapshot:
    ranks = tuple(replace(r, node=n) for r, n in zip(sim.ranks, nodes, strict=True))
    return replace(sim, ranks=ranks)


def test_ranks_are_counted_per_node() -> None:
    two_nodes = (NodeCores("n1", 2000), NodeCores("n2", 2000))
    a = _on(auto("a", (500,) * 4), "n1", "n1", "n2", "n2")
    obs = replace(observe(0.0, a, capacity=4000), nodes=two_nodes)
    # 2 ranks on each 2-core node: spin
    assert switches(decide(obs, state_of(a=FIXED), S)) == []
    # b puts one more rank on n1: a has ranks there, so a waits politely; b too
    b = _on(auto("b", (500,)), "n1")
    d = decide(replace(obs, sims=(a, b)), state_of(a=FIXED, b=FIXED), S)
    assert sorted(switches(d)) == [("a", "polite"), ("b", "polite")]
    (action,) = (x for x in d.actions if isinstance(x, SetWaitMode) and x.sim_id == "a")
    assert "3 ranks on the 2 cores of node n1" in action.reason and "n2" not in action.reason
    assert [r.node for r in action.ranks] == ["n1", "n1", "n2", "n2"]
    assert action.ranks[2].why == "2 ranks on the 2 cores of node n2"
    assert action.ranks[0].why == "3 ranks on the 2 cores of node n1 (oversubscribed)"
    # b on n2 instead: n2 is crowded, n1 is not: both still polite (a spans both)
    b2 = _on(auto("b", (500,)), "n2")
    d2 = decide(replace(obs, sims=(a, b2)), state_of(a=FIXED, b=FIXED), S)
    assert sorted(switches(d2)) == [("a", "polite"), ("b", "polite")]


def test_other_rank_pods_on_a_node_count() -> None:
    a = _on(auto("a", (500, 500)), "n1", "n1")
    obs = replace(observe(0.0, a, capacity=2000), nodes=(NodeCores("n1", 2000, other_ranks=1),))
    d = decide(obs, state_of(a=FIXED), S)
    assert switches(d) == [("a", "polite")]
    assert "3 ranks on the 2 cores of node n1" in d.actions[0].reason  # type: ignore[union-attr]


def test_unplaced_ranks_on_several_nodes_count_against_the_whole_cluster() -> None:
    nodes = (NodeCores("n1", 1000), NodeCores("n2", 1000))
    a = _on(auto("a", (500, 500)), "n1", "n2")
    pending = replace(_on(auto("b", (500,)), None), starting=True)
    obs = replace(observe(0.0, a, pending, capacity=2000), nodes=nodes)
    # a's ranks each have a core; b's rank is not placed yet: 3 ranks on the cluster's 2
    # cores, but a is on nodes where each rank has a core -> a keeps spinning
    assert switches(decide(obs, state_of(a=FIXED), S)) == []
    choice = waits.at_launch(obs, "auto", (500, 500))
    assert choice.mode == "polite"
    assert "5 ranks on the 2 cores of the cluster" in choice.reason


@pytest.mark.parametrize(
    ("setting", "ranks", "mode", "idle_yield"),
    [
        ("auto", 2, "spin", False),  # a core per rank: spin, no yield
        ("auto", 4, "polite", True),  # 4 ranks on 2 cores
        ("spin", 2, "spin", False),
        ("spin", 4, "spin", True),  # fixed spin on a crowded node still yields in MPI
        ("polite", 2, "polite", True),
    ],
)
def test_the_mpi_library_yields_unless_every_rank_spins_on_its_own_core(
    setting: str, ranks: int, mode: str, idle_yield: bool
) -> None:
    choice = waits.at_launch(observe(0.0, capacity=2000), setting, (500,) * ranks)  # type: ignore[arg-type]
    assert (choice.mode, choice.idle_yield) == (mode, idle_yield)
    env = waits.mpi_idle_env(choice.idle_yield)
    assert env["OMPI_MCA_mpi_yield_when_idle"] == ("1" if idle_yield else "0")
    assert env["MPIR_CVAR_POLLS_BEFORE_YIELD"] == ("1000" if idle_yield else "0")


@pytest.mark.parametrize("mode", ["spin", "polite", "adaptive"])
def test_a_fixed_mode_is_never_switched(mode: str) -> None:
    a = replace(snap("a", (500, 500)), wait=mode)
    b = replace(snap("b", (500, 500)), wait=mode)
    d = decide(observe(0.0, a, b, capacity=2000), state_of(a=FIXED, b=FIXED), S)
    assert switches(d) == []


def test_no_switch_before_every_rank_has_shim_data() -> None:
    a = auto("a", (500, 500))
    no_data = replace(a, ranks=(a.ranks[0], replace(a.ranks[1], compute_ns=None, mpi_ns=None)))
    d = decide(observe(0.0, no_data, auto("b", (500, 500)), capacity=2000),
               state_of(a=FIXED, b=FIXED), S)  # fmt: skip
    assert switches(d) == [("b", "polite")]
    # once a's ranks publish, a is switched too
    d2 = decide(observe(1.0, a, auto("b", (500, 500)), capacity=2000), d.state, S)
    assert switches(d2) == [("a", "polite")]


def test_decide_is_pure_for_wait_modes() -> None:
    obs = observe(0.0, auto("a", (500, 500)), auto("b", (500, 500)), capacity=2000)
    state = ControllerState()
    assert decide(obs, state, S) == decide(obs, state, S)


def grouped_auto(
    sim_id: str, requests: tuple[int, ...], pods: tuple[str | None, ...]
) -> SimSnapshot:
    """An ``auto`` simulation whose ranks run in these pods (one pod: a rank group)."""
    sim = auto(sim_id, requests)
    ranks = tuple(replace(r, pod=p) for r, p in zip(sim.ranks, pods, strict=True))  # type: ignore[type-var]
    return replace(sim, ranks=ranks, mpi_yields=True)


def test_own_ranks_in_one_rank_group_outnumbering_the_cores_spin_with_the_mpi_yield() -> None:
    # 4 ranks on 2 cores, all in one cgroup: their own yields reach each other (decision
    # 0012), so a polite wait's sleeps would only cost; the MPI library's idle yield stays on
    a = grouped_auto("a", (500,) * 4, ("run-a",) * 4)
    polite_a = SimMemory(stage="fixed", wait_mode="polite")
    d = decide(observe(0.0, replace(a, wait_mode="polite"), capacity=2000),
               state_of(a=polite_a), S)  # fmt: skip
    assert switches(d) == [("a", "spin")]
    reason = next(x.reason for x in d.actions if isinstance(x, SetWaitMode))
    assert "its own ranks outnumber cores, in one cgroup" in reason
    loads = waits.node_loads(observe(0.0, a, capacity=2000))
    nodes = waits.nodes_of(observe(0.0, a, capacity=2000))
    own = waits.grouped([(r.node, r.pod) for r in a.ranks], nodes)
    choice = waits.choose("auto", [r.node for r in a.ranks], loads, nodes, "", own)
    assert choice.mode == "spin" and choice.idle_yield


@pytest.mark.parametrize(
    "pods",
    [
        ("run-a",) * 3 + ("other",),  # its ranks in two cgroups: a yield does not cross
        ("p0", "p1", "p2", "p3"),  # a pod per rank
        ("run-a",) * 3 + (None,),  # a rank whose pod is not known yet
    ],
)
def test_ranks_not_all_in_one_group_wait_politely(pods: tuple[str | None, ...]) -> None:
    a = grouped_auto("a", (500,) * 4, pods)
    d = decide(observe(0.0, a, capacity=2000), state_of(a=FIXED), S)
    assert switches(d) == [("a", "polite")]


def test_a_rank_group_sharing_its_node_with_another_simulation_waits_politely() -> None:
    a = grouped_auto("a", (500, 500), ("run-a",) * 2)
    b = grouped_auto("b", (500, 500), ("run-b",) * 2)
    d = decide(observe(0.0, a, b, capacity=2000), state_of(a=FIXED, b=FIXED), S)
    assert sorted(switches(d)) == [("a", "polite"), ("b", "polite")]
    # b ended: a alone, in one group, 2 ranks on 2 cores: spin (a core each)
    d2 = decide(observe(1.0, a, capacity=2000), d.state, S)
    assert switches(d2) == [("a", "spin")]


def test_a_rank_group_whose_mpi_never_yields_waits_politely() -> None:
    # MPICH's ch4 has no idle yield: spinning ranks in one cgroup would not hand over cores
    a = replace(grouped_auto("a", (500,) * 4, ("run-a",) * 4), mpi_yields=False)
    d = decide(observe(0.0, a, capacity=2000), state_of(a=FIXED), S)
    assert switches(d) == [("a", "polite")]


@pytest.mark.parametrize(
    ("groups", "yields", "beside", "want"),
    [
        (True, True, False, "spin"),  # alone, one cgroup, Open MPI: its own yield
        (False, True, False, "polite"),  # a cgroup (pod) per rank: no yield across
        (True, False, False, "polite"),  # MPICH: no idle yield
        (True, True, True, "polite"),  # another simulation on the node
    ],
)
def test_the_launch_mode_counts_a_rank_group_the_backend_will_make(
    groups: bool, yields: bool, beside: bool, want: str
) -> None:
    node = NodeCores("vm", 2000, rank_groups=groups)
    running = (grouped_auto("b", (500, 500), ("run-b",) * 2),) if beside else ()
    obs = observe(0.0, *running, nodes=(node,))
    choice = waits.at_launch(obs, "auto", (500,) * 4, (), mpi_yields=yields)
    assert choice.mode == want
    assert choice.idle_yield  # 4 ranks on 2 cores: the library's own yield is on either way


@pytest.mark.parametrize(("yields", "want"), [(True, "spin"), (False, "polite")])
def test_a_case_staged_ahead_launches_as_its_own_rank_group(yields: bool, want: str) -> None:
    # the next copy, staged while the one before ran, launched in the step that finds the
    # node empty: alone in one cgroup it spins as a run staged then would (issue 42: it was
    # launched polite, and switched a tick later, a wait mode its single run never had)
    node = NodeCores("vm", 2000, rank_groups=True)
    head = QueuedSim(queue_id=1, n_ranks=4, initial_request_millis=(500,) * 4, ahead="s1",
                     wait="auto", mpi_yields=yields)  # fmt: skip
    d = decide(observe(10.0, queue=[head], nodes=(node,)), state_of(), S)
    (launch,) = [a for a in d.actions if isinstance(a, Launch)]
    assert launch.sim_id == "s1" and launch.wait.mode == want
