"""Table tests of the controller's decision step across simulations: (C) launches, (D)
fairness (with a closed-loop toy plant) and a property test of capacity and floors.

The clock is fake: it is only the ``now_s`` passed in the observations.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from rankpack.controller.decision import ControllerState, QueuedSim, SimMemory, SimSnapshot
from rankpack.controller.policy import decide
from rankpack.core.actions import Resize
from rankpack.plan.submission import Phase

from ._helpers import (
    GIGA,
    SIZED,
    S,
    apply,
    launches,
    notes,
    observe,
    resizes,
    snap,
    state_of,
)

S = replace(S, gate="duty")
"""These cases are about room and order: the duty-cycle gate never packs (the default
``limit`` gate's packing is tested in test_limit_gate.py)."""

# --- (C) launch --------------------------------------------------------------------------


def head(need_per_rank: int = 500, n: int = 4, queue_id: int = 7) -> QueuedSim:
    return QueuedSim(queue_id=queue_id, n_ranks=n, initial_request_millis=(need_per_rank,) * n)


@dataclass(frozen=True)
class LaunchCase:
    name: str
    queue: tuple[QueuedSim, ...]
    expect: str
    """"launch", "note:<code>", or "nothing"."""
    stage: str | None = "sized"
    """Stage of the one running simulation (None: nothing runs)."""
    last_launch_s: float | None = None
    max_concurrent: int = 4
    duty: float = 0.1


# running: one sim of 4 x 250m = 1000m on 4000m -> 3000m unrequested
LAUNCH_CASES = [
    LaunchCase("fits", (head(500),), "launch"),
    LaunchCase("fits exactly", (head(750),), "launch"),
    LaunchCase(
        "doesn't fit by 1 millicore",
        (QueuedSim(7, 4, (750, 750, 750, 751)),),
        "note:no-room",
    ),
    LaunchCase("profiling in progress", (head(500),), "note:measuring", stage="profiling"),
    LaunchCase("warm-up in progress", (head(500),), "note:measuring", stage="warmup"),
    LaunchCase("cooldown", (head(500),), "note:cooldown", last_launch_s=99.0),
    LaunchCase("cooldown over", (head(500),), "launch", last_launch_s=98.0),
    LaunchCase("max_concurrent", (head(500),), "note:max-concurrent", max_concurrent=1),
    LaunchCase("empty queue", (), "nothing"),
    LaunchCase("nothing running: immediate", (head(5000),), "launch", stage=None),
    LaunchCase("phase-scheduled sim counts as ready", (head(500),), "launch", stage="scheduled"),
    LaunchCase("high duty: model says no gain", (head(500),), "note:no-gain", duty=0.9),
    LaunchCase("low duty: model says gain", (head(500),), "launch", duty=0.05),
]


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: c.name)
def test_launch_gate(case: LaunchCase) -> None:
    sims: tuple[SimSnapshot, ...] = ()
    mems: dict[str, SimMemory] = {}
    if case.stage is not None:
        duty_ns = round(case.duty * GIGA)
        sims = (
            snap(
                requests=(250,) * 4,
                compute_ns=(duty_ns,) * 4,
                mpi_ns=(GIGA - duty_ns,) * 4,
                phases=(Phase(0.0, (250,) * 4),) if case.stage == "scheduled" else (),
            ),
        )
        mems["a"] = SimMemory(stage=case.stage, duty=(case.duty,) * 4, phase_index=0)  # type: ignore[arg-type]
    state = ControllerState(sims=mems, last_launch_s=case.last_launch_s)
    settings_ = replace(S, max_concurrent=case.max_concurrent)
    d = decide(observe(100.0, *sims, queue=case.queue, capacity=4000), state, settings_)
    assert not resizes(d)
    if case.expect == "launch":
        assert [a.queue_id for a in launches(d)] == [case.queue[0].queue_id]
        assert d.state.last_launch_s == 100.0
        assert not notes(d, "launch-held")
    elif case.expect == "nothing":
        assert not launches(d)
        assert not notes(d, "launch-held")
    else:
        code = case.expect.removeprefix("note:")
        assert not launches(d)
        assert len(notes(d, "launch-held")) == 1
        assert d.state.launch_held == code
        assert d.state.last_launch_s == case.last_launch_s


def test_only_the_head_of_the_queue_launches_without_backfill() -> None:
    sim = snap(requests=(250,) * 4)
    state = state_of(a=replace(SIZED, duty=(0.1,) * 4))
    queue = (head(1000, queue_id=1), head(100, queue_id=2))
    fifo = replace(S, backfill_wait_s=0.0)
    d = decide(observe(100.0, sim, queue=queue, capacity=4000), state, fifo)
    assert not launches(d)  # no overtaking: 2 would fit, 1 does not
    # with backfill (the default), 2 starts ahead of 1 (test_policy_backfill.py)
    d = decide(observe(100.0, sim, queue=queue, capacity=4000), state, S)
    assert [a.queue_id for a in launches(d)] == [2]
    empty = decide(observe(100.0, queue=queue, capacity=4000), ControllerState(), fifo)
    assert [a.queue_id for a in launches(empty)] == [1]


def test_launch_held_note_only_when_the_reason_changes() -> None:
    sim = snap(requests=(250,) * 4)
    state = state_of(a=replace(SIZED, duty=(0.1,) * 4))
    big = (head(1000),)
    held = []
    for t, settings_ in enumerate([S, S, S, replace(S, max_concurrent=1), S]):
        d = decide(observe(100.0 + t, sim, queue=big, capacity=4000), state, settings_)
        state = d.state
        held.append([n.reason.split(" ")[0] for n in notes(d, "launch-held")])
    assert [len(h) for h in held] == [1, 0, 0, 1, 1]
    assert state.launch_held == "no-room"


# --- (D) fairness ------------------------------------------------------------------------


def rated(sim_id: str, requests: Sequence[int], rate_per_s: float, now: float) -> SimSnapshot:
    """A sim whose progress advanced ``rate_per_s`` (fraction) over the last 6 s."""
    return snap(sim_id, requests, iterations=round(rate_per_s * 6 * 100_000), expected=100_000)


def fair_mem(**kw: object) -> SimMemory:
    return replace(SIZED, duty=(0.1,) * 4, rate_marks=((94.0, 0),), **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class FairCase:
    name: str
    rates: tuple[float, float]
    expect: tuple[int, int]
    """Totals of sims a and b after the step."""
    capacity: int = 8000
    budget: int = 8000
    mem_a: SimMemory | None = None
    mem_b: SimMemory | None = None
    engaged: bool = False


FAIR_CASES = [
    FairCase("within threshold: nothing", (0.0091, 0.01), (1000, 2000)),
    FairCase("slowest raised by the step", (0.005, 0.01), (1100, 2000)),
    FairCase("raise capped by capacity", (0.005, 0.01), (1050, 2000), capacity=3050),
    FairCase("raise capped by budget", (0.005, 0.01), (1020, 2000), budget=1020),
    FairCase("no room: fastest lowered by the step", (0.005, 0.01), (1000, 1800), capacity=3000),
    FairCase(
        "slowest in cooldown: wait",
        (0.005, 0.01),
        (1000, 2000),
        mem_a=fair_mem(last_adjust_s=97.0, last_adjust_sign=1),
    ),
    FairCase(
        "raise would reverse a recent lowering: lower the fastest",
        (0.005, 0.01),
        (1000, 1800),
        mem_a=fair_mem(last_adjust_s=90.0, last_adjust_sign=-1),
    ),
    FairCase(
        "reversal allowed after 2 x cooldown",
        (0.005, 0.01),
        (1100, 2000),
        mem_a=fair_mem(last_adjust_s=80.0, last_adjust_sign=-1),
    ),
    FairCase(
        "hysteresis: engaged acts below threshold", (0.0093, 0.01), (1100, 2000), engaged=True
    ),
    FairCase("hysteresis: stops below half", (0.0096, 0.01), (1000, 2000), engaged=True),
]


@pytest.mark.parametrize("case", FAIR_CASES, ids=lambda c: c.name)
def test_fairness_step(case: FairCase) -> None:
    a = replace(rated("a", (250,) * 4, case.rates[0], 100.0), budget_millis=case.budget)
    b = rated("b", (500,) * 4, case.rates[1], 100.0)
    state = ControllerState(
        sims={"a": case.mem_a or fair_mem(), "b": case.mem_b or fair_mem()},
        fairness_engaged=case.engaged,
    )
    d = decide(observe(100.0, a, b, capacity=case.capacity), state, S)
    after = apply([a, b], d.actions)
    assert (after[0].requested_millis, after[1].requested_millis) == case.expect
    assert all(r.kind == "fairness" for r in resizes(d))
    for before, now in zip((a, b), after, strict=True):
        assert abs(now.requested_millis - before.requested_millis) <= S.fairness_step * (
            before.requested_millis
        )


def test_no_fairness_while_a_sim_is_profiling() -> None:
    a = rated("a", (250,) * 4, 0.005, 100.0)
    b = rated("b", (500,) * 4, 0.01, 100.0)
    c = snap("c", (100, 100))
    prof = SimMemory(
        stage="profiling",
        profile_start_s=99.0,
        profile_start=((0, 0),) * 2,
        profile_start_usage=(0, 0),
        profile_start_progress=c.progress,
    )
    state = state_of(a=fair_mem(), b=fair_mem(), c=prof)
    d = decide(observe(100.0, a, b, c), state, S)
    assert not resizes(d)


@dataclass(frozen=True)
class LoopCase:
    name: str
    requests: dict[str, int]
    """Per-rank request of each sim (4 ranks each) at the start."""
    capacity: int


LOOP_CASES = [
    LoopCase("room to raise the slowest", {"a": 250, "b": 500}, 4000),
    LoopCase("no room: lower the fastest", {"a": 250, "b": 500}, 3000),
    LoopCase("three sims", {"a": 150, "b": 250, "c": 350}, 3200),
    LoopCase("slightly unfair", {"a": 450, "b": 500}, 4000),
]


@pytest.mark.parametrize("case", LOOP_CASES, ids=lambda c: c.name)
def test_fairness_converges_in_closed_loop(case: LoopCase) -> None:
    """Toy plant: each sim's progress rate is its share of the requested CPU."""
    expected = 10**7
    speed = 100_000.0  # iterations per second shared among the sims
    sims = [
        snap(sid, (req,) * 4, iterations=0, expected=expected, budget=4000)
        for sid, req in case.requests.items()
    ]
    done = {s.sim_id: 0.0 for s in sims}
    state = ControllerState(sims={s.sim_id: replace(SIZED, duty=(0.1,) * 4) for s in sims})
    signs: dict[str, list[int]] = {s.sim_id: [] for s in sims}

    def rates() -> dict[str, float]:
        total = sum(s.requested_millis for s in sims)
        return {s.sim_id: s.requested_millis / total * speed for s in sims}

    for t in range(121):
        obs = observe(float(t), *sims, capacity=case.capacity)
        d = decide(obs, state, S)
        state = d.state
        assert not launches(d)
        new = apply(sims, d.actions)
        for before, after in zip(sims, new, strict=True):
            delta = after.requested_millis - before.requested_millis
            assert abs(delta) <= S.fairness_step * before.requested_millis
            if delta:
                signs[before.sim_id].append(1 if delta > 0 else -1)
        assert sum(s.requested_millis for s in new) <= case.capacity
        sims = new
        for sid, r in rates().items():
            done[sid] += r
        sims = [replace(s, iterations=int(done[s.sim_id])) for s in sims]

    final = rates()
    assert max(final.values()) / min(final.values()) < 1 + S.fairness_threshold
    assert any(signs.values())
    for sid, seq in signs.items():
        changes = sum(1 for x, y in itertools.pairwise(seq) if x != y)
        assert changes <= 1, (sid, seq)


# --- properties --------------------------------------------------------------------------


@st.composite
def sim_and_memory(draw: st.DrawFn, sim_id: str) -> tuple[SimSnapshot, SimMemory]:
    n = draw(st.integers(1, 4))
    requests = draw(st.lists(st.integers(0, 2000), min_size=n, max_size=n))
    counters = st.lists(st.integers(0, 10 * GIGA), min_size=n, max_size=n)
    phases: tuple[Phase, ...] = ()
    stage = draw(st.sampled_from(["warmup", "profiling", "sized", "scheduled"]))
    if stage == "scheduled":
        k = draw(st.integers(1, 3))
        starts = sorted(draw(st.lists(st.floats(0, 1), min_size=k, max_size=k)))
        phases = tuple(
            Phase(s, tuple(draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))))
            for s in starts
        )
    expected = draw(st.integers(1, 1000))
    sim = snap(
        sim_id,
        requests,
        iterations=draw(st.integers(0, expected)),
        expected=expected,
        budget=draw(st.integers(0, 8000)),
        usage_ns=draw(counters),
        compute_ns=draw(counters),
        mpi_ns=draw(counters),
        phases=phases,
    )
    small = st.integers(0, GIGA)
    mem = SimMemory(
        stage=stage,  # type: ignore[arg-type]
        profile_start_s=draw(st.floats(0, 100)),
        profile_start=tuple((draw(small), draw(small)) for _ in range(n)),
        profile_start_usage=tuple(draw(small) for _ in range(n)),
        duty=tuple(draw(st.floats(0, 1)) for _ in range(n)),
        phase_index=draw(st.integers(-1, 0)),
        rate_marks=((draw(st.floats(80, 95)), draw(st.integers(0, expected))),),
        last_adjust_s=draw(st.none() | st.floats(0, 100)),
        last_adjust_sign=draw(st.sampled_from([-1, 0, 1])),
    )
    return sim, mem


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(st.sampled_from("abc"), min_size=0, max_size=3, unique=True).flatmap(
        lambda ids: st.tuples(*(sim_and_memory(i) for i in ids))
    ),
    capacity=st.integers(0, 12000),
    floor=st.integers(0, 200),
    engaged=st.booleans(),
    queue=st.lists(st.integers(1, 1500), max_size=4),
)
def test_requests_never_exceed_capacity_and_resizes_respect_floor(
    pairs: tuple[tuple[SimSnapshot, SimMemory], ...],
    capacity: int,
    floor: int,
    engaged: bool,
    queue: list[int],
) -> None:
    sims = [p[0] for p in pairs]
    state = ControllerState(
        sims={s.sim_id: m for s, m in pairs}, fairness_engaged=engaged, last_launch_s=None
    )
    q = (QueuedSim(1, len(queue), tuple(queue)),) if queue else ()
    settings_ = replace(S, floor_millis=floor)
    d = decide(observe(100.0, *sims, queue=q, capacity=capacity), state, settings_)
    fits_before = sum(s.requested_millis for s in sims) <= capacity
    for a in d.actions:
        event(f"{type(a).__name__}:{getattr(a, 'kind', '')}")
    current = list(sims)
    for a in d.actions:
        if isinstance(a, Resize):
            assert a.request_millis >= floor
            current = apply(current, [a])
            if fits_before:
                assert sum(s.requested_millis for s in current) <= capacity
    assert len(launches(d)) <= 1
    assert set(d.state.sims) == {s.sim_id for s in sims}
    # fairness never moves a total by more than the step
    for before, after in zip(sims, current, strict=True):
        kinds = {a.kind for a in d.actions if isinstance(a, Resize) and a.sim_id == before.sim_id}
        if kinds == {"fairness"}:
            change = abs(after.requested_millis - before.requested_millis)
            assert change <= S.fairness_step * before.requested_millis
