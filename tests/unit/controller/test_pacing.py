"""Resize storms bounded (issue 29): at most so many resizes a second over the cluster and
per node, decreases first; what waits is sent in later steps, and the capacity counts it
as not sent. The clock is fake."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from rankpack.controller.decision import (
    ControllerSettings,
    ControllerState,
    NodeCores,
    Observations,
    RankSnapshot,
    SimMemory,
    SimSnapshot,
)
from rankpack.controller.pacing import Pacer, pace
from rankpack.controller.policy import decide
from rankpack.controller.step import Step
from rankpack.core.actions import Resize

from ._helpers import GIGA, resizes

S = ControllerSettings(
    resize_rate_per_s=10.0, resize_burst=20, resize_rate_per_node_s=2.0, resize_node_burst=4
)


def sim(sim_id: str, nodes: list[str | None], millis: int = 1000) -> SimSnapshot:
    return SimSnapshot(
        sim_id=sim_id,
        started_s=0.0,
        iterations=50,
        expected_iterations=100,
        budget_millis=1000 * len(nodes),
        ranks=tuple(RankSnapshot(i, millis, 0, 0, 0, node=n) for i, n in enumerate(nodes)),
    )


def test_a_sizing_storm_on_one_node_goes_out_at_the_node_rate_decreases_first() -> None:
    # a simulation of 8 ranks on one node, profiled: its sizing lowers 6 ranks (duty 0.2:
    # 250m) and raises 2 (duty 1: 1250m)
    ranks = 8
    a = replace(
        sim("a", ["n0"] * ranks),
        ranks=tuple(
            RankSnapshot(i, 1000, usage_ns=5 * GIGA, compute_ns=(1 if i < 6 else 5) * GIGA,
                         mpi_ns=(4 if i < 6 else 0) * GIGA, node="n0")
            for i in range(ranks)
        ),
    )  # fmt: skip
    mem = SimMemory(stage="profiling", profile_start_s=0.0, profile_start=((0, 0),) * ranks,
                    profile_start_usage=(0,) * ranks)  # fmt: skip
    obs = Observations(now_s=5.0, capacity_millis=16000, sims=(a,), queue=(),
                       nodes=(NodeCores("n0", 8000), NodeCores("n1", 8000)))  # fmt: skip
    d = decide(obs, ControllerState(sims={"a": mem}), S)
    sent = resizes(d)
    assert [(r.rank, r.request_millis) for r in sent] == [(i, 250) for i in range(4)]
    waiting = d.state.resize_queue  # the node's burst is 4: the rest waits, in order
    assert [(r.rank, r.request_millis) for r in waiting] == [(4, 250), (5, 250), (6, 1250),
                                                             (7, 1250)]  # fmt: skip
    assert d.state.resize_node_buckets["n0"] == (0.0, 5.0)
    assert d.state.sims["a"].stage == "sized"  # decided: it is sized, its resizes wait
    # 1 s later the node allows 2 more: the two decreases left
    again = decide(replace(obs, now_s=6.0, sims=(_applied(a, sent),)), d.state, S)
    assert resizes(again) == list(waiting[:2])
    assert again.state.resize_queue == waiting[2:]


def _applied(s: SimSnapshot, sent: list[Resize]) -> SimSnapshot:
    ranks = list(s.ranks)
    for r in sent:
        ranks[r.rank] = replace(ranks[r.rank], request_millis=r.request_millis)
    return replace(s, ranks=tuple(ranks))


def test_a_waiting_increase_holds_its_room_and_a_waiting_decrease_frees_nothing() -> None:
    a = sim("a", ["n0", "n0"])
    obs = Observations(now_s=0.0, capacity_millis=4000, sims=(a,), queue=())
    waiting = (Resize("a", 0, 500, "size", "size"), Resize("a", 1, 1500, "size", "size"))
    step = Step(obs=obs, settings=S)
    step.queued(waiting)
    assert step.requests["a"] == [500, 1500]  # what the rules see
    assert step.unrequested() == 4000 - 1000 - 1500  # what the capacity counts


def test_a_newer_decision_replaces_a_waiting_one_and_an_ended_simulation_drops_it() -> None:
    a = sim("a", ["n0", "n0"])
    obs = Observations(now_s=0.0, capacity_millis=4000, sims=(a,), queue=())
    state = ControllerState(resize_queue=(
        Resize("a", 0, 500, "old", "size"), Resize("gone", 0, 500, "old", "size"),
        Resize("a", 1, 1000, "already", "size"),
    ))  # fmt: skip
    step = Step(obs=obs, settings=S)
    step.queued(state.resize_queue)
    assert [(r.sim_id, r.rank) for r in step.waiting] == [("a", 0)]
    step.actions.append(Resize("a", 0, 700, "new", "fairness"))
    left = pace(step, state, Pacer.of(state, 0.0, S))
    assert left == () and [r.reason for r in resizes_of(step)] == ["new"]


def resizes_of(step: Step) -> list[Resize]:
    return [a for a in step.actions if isinstance(a, Resize)]


@settings(max_examples=300, deadline=None)
@given(
    wanted=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(1, 2000)),
        max_size=40,
    ),
    overall=st.floats(0.0, 25.0),
    node_tokens=st.lists(st.floats(0.0, 5.0), min_size=3, max_size=3),
    queued=st.integers(0, 10),
)
def test_pacing_never_exceeds_the_buckets_and_loses_nothing(
    wanted: list[tuple[int, int, int]],
    overall: float,
    node_tokens: list[float],
    queued: int,
) -> None:
    """Resizes of 6 simulations x 4 ranks on 3 nodes (one rank not placed): what goes out
    fits the buckets, decreases before increases when any waits, and every decision is
    either sent or waits (the newest per rank)."""
    placement: list[str | None] = ["n0", "n1", "n2", None]
    sims = tuple(sim(f"s{i}", placement) for i in range(6))
    obs = Observations(now_s=0.0, capacity_millis=10**6, sims=sims, queue=())
    old = [Resize(f"s{s}", r, m, "old", "size") for s, r, m in wanted[:queued]]
    state = ControllerState(
        resize_queue=tuple(old),
        resize_bucket=(overall, 0.0),
        resize_node_buckets={f"n{i}": (t, 0.0) for i, t in enumerate(node_tokens)},
    )
    step = Step(obs=obs, settings=S)
    step.queued(state.resize_queue)
    for s, r, m in wanted[queued:]:
        step.actions.append(Resize(f"s{s}", r, m, "new", "fairness"))
    decided: dict[tuple[str, int], Resize] = {}
    for a in [*step.waiting, *resizes_of(step)]:
        decided[(a.sim_id, a.rank)] = a
    new_keys = {(a.sim_id, a.rank) for a in resizes_of(step)}
    expected = {k: a for k, a in decided.items() if a.request_millis != 1000 or k in new_keys}
    before = resizes_of(step)
    left = pace(step, state, Pacer.of(state, 0.0, S))
    sent = resizes_of(step)
    assert len(sent) <= overall + 1e-9
    for i, t in enumerate(node_tokens):
        assert sum(1 for a in sent if placement[a.rank] == f"n{i}") <= t + 1e-9
    if left:
        # decreases first: none after a resize that is not one (a resize to the rank's own
        # request, 1000m here, is neither: it may go out after an increase)
        downs = [a.request_millis < 1000 for a in sent]
        assert downs == sorted(downs, reverse=True)
    if sent == before and not left:
        return  # nothing was paced: the actions as the rules emitted them
    got = {(a.sim_id, a.rank): a for a in [*sent, *left]}
    assert len(got) == len(sent) + len(left)  # a rank once
    assert {k: a for k, a in got.items() if k in expected} == expected
