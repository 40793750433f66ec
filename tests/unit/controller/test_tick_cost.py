"""A tick's cost grows with what changed (issue 29): what the loop and the decision step
keep or build lazily to that end is always what a count from scratch gives, and a rank
observation handed over as it is decides like a copy of it."""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rankpack.backend.protocol import RankObservation, RankPhase, RankResources
from rankpack.controller import gains, waits
from rankpack.controller.decision import (
    ControllerSettings,
    ControllerState,
    NodeCores,
    Observations,
    QueuedSim,
    RankSnapshot,
    SimMemory,
    SimSnapshot,
)
from rankpack.controller.loop import Collector
from rankpack.controller.outcomes import keep_mark
from rankpack.controller.policy import decide
from rankpack.controller.resizes import InFlight, Resizes
from rankpack.controller.step import Step

from ._helpers import GIGA

# -- the wait rule's node loads ----------------------------------------------------------


def loads_from_scratch(obs: Observations, launching: int) -> dict[str, waits.NodeLoad]:
    """`waits.node_loads` of several nodes that count this loop's ranks, as it was before
    the loads were built lazily (a dict of every node)."""
    nodes = obs.nodes
    counts = {n.name: n.other_ranks for n in nodes}
    counts[waits.CLUSTER] = counts.get(waits.CLUSTER, 0) + launching
    placed = 0
    for n in nodes:
        counts[n.name] += n.ours_ranks or 0
        placed += n.ours_ranks or 0
    ours = sum(len(sim.ranks) for sim in obs.sims)
    counts[waits.CLUSTER] += max(0, ours - placed)
    loads = {n.name: waits.NodeLoad(n.name, counts[n.name], n.allocatable_millis) for n in nodes}
    loads[waits.CLUSTER] = waits.NodeLoad(
        waits.CLUSTER, sum(counts.values()), sum(n.allocatable_millis for n in nodes)
    )
    return loads


def rank_sim(sim_id: str, n: int) -> SimSnapshot:
    return SimSnapshot(sim_id, 0.0, 0, 10, 1000 * n,
                       tuple(RankSnapshot(i, 500, 0, None, None) for i in range(n)))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.lists(
        st.tuples(st.integers(1, 16), st.integers(0, 20), st.integers(0, 20)),
        min_size=2, max_size=8,
    ),
    sims=st.lists(st.integers(1, 40), max_size=5),
    launching=st.integers(0, 12),
    lookups=st.lists(st.integers(-1, 9), max_size=12),
)  # fmt: skip
def test_the_loads_built_per_node_looked_up_are_those_counted_from_scratch(
    nodes: list[tuple[int, int, int]], sims: list[int], launching: int, lookups: list[int]
) -> None:
    obs = Observations(
        now_s=0.0, capacity_millis=1000, queue=(),
        sims=tuple(rank_sim(f"s{i}", n) for i, n in enumerate(sims)),
        nodes=tuple(NodeCores(f"n{i}", cores * 1000, other_ranks=other, ours_ranks=ours)
                    for i, (cores, other, ours) in enumerate(nodes)),
    )  # fmt: skip
    expected = loads_from_scratch(obs, launching)
    loads = waits.node_loads(obs, launching)
    assert isinstance(loads, waits.CountedLoads)  # (the lazy one, not the dict)
    for i in lookups:  # some nodes looked up first, in any order, some not at all
        name = waits.CLUSTER if i < 0 else f"n{i}"
        assert (name in loads) == (name in expected)
        if name in expected:
            assert loads[name] == expected[name]
    assert len(loads) == len(expected)
    assert list(loads) == list(expected)
    assert dict(loads.items()) == expected
    assert "elsewhere" not in loads


# -- the limit gate's loads --------------------------------------------------------------

duties = st.floats(-0.2, 1.3, allow_nan=False)
counter = st.one_of(st.none(), st.integers(0, 5 * GIGA))


@st.composite
def running_sims(draw: Any) -> tuple[SimSnapshot, SimMemory]:
    n = draw(st.integers(1, 6))
    ranks = tuple(RankSnapshot(i, 500, 0, draw(counter), draw(counter)) for i in range(n))
    wait = draw(st.sampled_from(["spin", "polite", "auto"]))
    sim = SimSnapshot(draw(st.uuids()).hex, 0.0, 5, 10, 1000 * n, ranks, wait=wait)
    stage = draw(st.sampled_from(["sized", "warmup", "profiling"]))
    duty = tuple(draw(st.lists(duties, min_size=n - 1, max_size=n + 1)))
    return sim, SimMemory(stage=stage, duty=duty)


def gate_loads_from_scratch(
    obs: Observations, memory: dict[str, SimMemory]
) -> tuple[list[float], float]:
    """The limit gate's loads as it counted them before the sums were kept: every rank's
    duty, summed here."""
    cores = obs.capacity_millis / 1000
    spin = any(sim.wait == "spin" for sim in obs.sims)
    per_sim = []
    for sim in obs.sims:
        mem = memory[sim.sim_id]
        if mem.stage == "sized" and len(mem.duty) == len(sim.ranks):
            per_sim.append(list(mem.duty))
            continue
        out = []
        for r in sim.ranks:
            c, m = r.compute_ns, r.mpi_ns
            out.append(c / (c + m) if c is not None and m is not None and c + m > 0 else 1.0)
        per_sim.append(out)
    loads = [
        min(float(len(sim.ranks)), cores)
        if spin or len(sim.ranks) > cores
        else sum(min(1.0, max(0.0, d)) for d in ds)
        for ds, sim in zip(per_sim, obs.sims, strict=True)
    ]
    flat = sum(sum(d) for d in per_sim), sum(len(d) for d in per_sim)
    return loads, flat[0] / max(1, flat[1])


@settings(max_examples=200, deadline=None)
@given(sims=st.lists(running_sims(), max_size=6), capacity=st.integers(1000, 12000))
def test_the_limit_gates_loads_are_those_summed_over_every_rank(
    sims: list[tuple[SimSnapshot, SimMemory]], capacity: int
) -> None:
    obs = Observations(now_s=0.0, capacity_millis=capacity, queue=(),
                       sims=tuple(s for s, _ in sims))  # fmt: skip
    memory = {s.sim_id: m for s, m in sims}
    expected = gate_loads_from_scratch(obs, memory)
    for _ in range(2):  # again with the sums kept by the same snapshots and memories
        loads = gains.limit_loads(Step(obs=obs, settings=ControllerSettings()), memory)
        assert (loads.running, loads.mean_duty) == expected  # to the last bit


# -- the duty marks of a rank ----------------------------------------------------------


def keep_mark_as_before(
    marks: list[tuple[int, int, int]], mark: tuple[int, int, int], expected: int
) -> None:
    if len(marks) < 2:
        marks.append(mark)
        return
    threshold = 0.1 * expected
    anchored = [m for m in marks[:-1] if m[0] >= threshold]
    if not anchored and marks[-1][0] >= threshold:
        marks.append(mark)
        return
    marks[-1] = mark


@given(
    steps=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 9), st.integers(0, 9)),
                   max_size=30),
    expected=st.integers(0, 200),
)  # fmt: skip
def test_a_ranks_duty_marks_are_kept_as_before(
    steps: list[tuple[int, int, int]], expected: int
) -> None:
    kept: list[tuple[int, int, int]] = []
    before: list[tuple[int, int, int]] = []
    iterations = 0
    for more, c, m in steps:
        iterations += more
        keep_mark(kept, (iterations, c, m), expected)
        keep_mark_as_before(before, (iterations, c, m), expected)
        assert kept == before


# -- resizes in flight per simulation ----------------------------------------------------


@given(
    changes=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 3), st.integers(-1, 1)), max_size=40
    )
)
def test_which_simulations_have_a_resize_in_flight_is_kept_with_the_flights(
    changes: list[tuple[str, int, int]],
) -> None:
    resizes = Resizes(SimpleNamespace(sims={}))  # type: ignore[arg-type]
    for sim_id, rank, change in changes:
        flight = None if change == 0 else InFlight(0.0, 500, 500 + 100 * change, "size", "")
        resizes._fly(sim_id, rank, flight)
        for s in "abc":
            assert resizes.flying_in(s) == any(resizes.inflight(s, r) is not None for r in range(4))


# -- a rank observation decided on as it is ---------------------------------------------


def as_observed(r: RankSnapshot) -> RankObservation:
    resources = RankResources(r.request_millis)
    return RankObservation(
        rank=r.rank, phase=RankPhase.RUNNING, desired=resources, allocated=resources,
        usage_ns=r.usage_ns, compute_ns=r.compute_ns, mpi_ns=r.mpi_ns, node=r.node,
    )  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(
    ranks=st.lists(
        st.tuples(st.integers(50, 2000), st.integers(0, 4), st.integers(0, 5), st.integers(0, 5)),
        min_size=1, max_size=6,
    ),
    stage=st.sampled_from(["warmup", "profiling", "sized"]),
    wait=st.sampled_from(["spin", "polite", "auto"]),
    queued=st.integers(0, 6),
)  # fmt: skip
def test_the_backends_rank_observations_are_decided_on_like_copies_of_them(
    ranks: list[tuple[int, int, int, int]], stage: str, wait: str, queued: int
) -> None:
    n = len(ranks)
    copies = tuple(
        RankSnapshot(i, millis, (c + m) * GIGA, c * GIGA, m * GIGA, node=f"n{node}")
        for i, (millis, node, c, m) in enumerate(ranks)
    )
    nodes = tuple(NodeCores(f"n{i}", 2000, ours_ranks=sum(1 for r in ranks if r[1] == i),
                            ours_millis=sum(r[0] for r in ranks if r[1] == i))
                  for i in range(5))  # fmt: skip
    memory = SimMemory(stage=stage, profile_start_s=0.0, profile_start=((0, 0),) * n,  # type: ignore[arg-type]
                       profile_start_usage=(0,) * n, duty=(0.5,) * n)  # fmt: skip
    queue = (QueuedSim(1, queued, (500,) * queued),) if queued else ()
    decisions = []
    for view in (copies, tuple(as_observed(r) for r in copies)):
        sim = SimSnapshot("a", 0.0, 60, 100, 2000 * n, view, wait=wait)  # type: ignore[arg-type]
        obs = Observations(now_s=10.0, capacity_millis=10000, sims=(sim,), queue=queue,
                           nodes=nodes)  # fmt: skip
        decisions.append(decide(obs, ControllerState(sims={"a": memory}), ControllerSettings()))
    assert decisions[0] == decisions[1]


# -- garbage collected between ticks -----------------------------------------------------


def test_the_older_generations_are_collected_between_ticks_when_due_and_thresholds_restored() -> (
    None
):
    before = gc.get_threshold()
    collector = Collector()
    try:
        collector.start()
        assert gc.get_threshold()[0] == before[0]  # the youngest: by the interpreter
        assert gc.get_threshold()[1:] == (1 << 30, 1 << 30)  # the others: between ticks
        gc.collect()  # every count at 0
        collector.between_ticks()
        assert collector.collections == 0  # nothing due
        for _ in range(before[1] + 1):  # more young collections than the threshold of one
            gc.collect(0)
        collector.between_ticks()
        assert collector.collections == 1
        assert gc.get_count()[1] == 0  # the middle one was collected
    finally:
        collector.stop()
    assert gc.get_threshold() == before


# -- the simulated cluster's rank observations -------------------------------------------


@given(
    usage=st.integers(0, 10 * GIGA),
    compute=counter,
    node=st.one_of(st.none(), st.sampled_from(["n0", "n1"])),
    restarts=st.integers(0, 3),
)
def test_the_simulators_rank_observations_are_the_dataclasses_own(
    usage: int, compute: int | None, node: str | None, restarts: int
) -> None:
    from rankpack.testing.simcluster import _rank_observation

    resources = RankResources(700, 900)
    given_fields: dict[str, Any] = dict(
        rank=3, phase=RankPhase.RUNNING, desired=resources, allocated=None, usage_ns=usage,
        restarts=restarts, node=node, compute_ns=compute, wait_mode="spin",
    )  # fmt: skip
    built = _rank_observation(**given_fields)
    expected = RankObservation(**given_fields)
    assert built == expected and hash(built) == hash(expected)
    assert vars(built) == {f: getattr(expected, f) for f in vars(built)}
    assert built.request_millis == 700 and built.limit_millis == 900
