"""Table tests of the controller's decision step for one simulation: memory, (A) warm-up
to profiling, (B) sizing from duty cycles, and phase schedules.

The clock is fake: it is only the ``now_s`` passed in the observations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from rankpack.controller.decision import ControllerState, SimMemory, SimSnapshot
from rankpack.controller.policy import decide
from rankpack.core.actions import Note, Resize
from rankpack.plan.submission import Phase

from ._helpers import (
    GIGA,
    S,
    apply,
    notes,
    observe,
    resizes,
    snap,
    state_of,
)

# --- memory ----------------------------------------------------------------------------


def test_new_sims_start_in_warmup_or_scheduled_and_finished_ones_are_dropped() -> None:
    plain = snap("plain", iterations=0)
    phased = snap("phased", iterations=0, phases=(Phase(0.5, (500, 500)),))
    d = decide(observe(0.0, plain, phased), ControllerState(), S)
    assert d.state.sims["plain"].stage == "warmup"
    assert d.state.sims["phased"].stage == "scheduled"

    d2 = decide(observe(1.0, phased), d.state, S)
    assert set(d2.state.sims) == {"phased"}


def test_rate_marks_keep_the_window_and_at_least_two() -> None:
    state = ControllerState()
    for t in range(20):
        state = decide(observe(float(t), snap(iterations=0)), state, S).state
    marks = state.sims["a"].rate_marks
    assert [m[0] for m in marks] == [13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0]
    # a long gap still leaves two marks
    state = decide(observe(100.0, snap(iterations=0)), state, S).state
    assert [m[0] for m in state.sims["a"].rate_marks] == [19.0, 100.0]


# --- (A) warmup -> profiling -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "iterations", "expected", "compute", "profiling"),
    [
        ("below warm-up fraction", 9, 100, (0, 0), False),
        ("at warm-up fraction", 10, 100, (0, 0), True),
        ("too few iterations", 2, 10, (0, 0), False),
        ("minimum iterations reached", 3, 10, (0, 0), True),
        ("a rank has no shim data", 50, 100, (0, None), False),
    ],
)
def test_warmup_to_profiling(
    name: str,
    iterations: int,
    expected: int,
    compute: tuple[int | None, int | None],
    profiling: bool,
) -> None:
    sim = snap(iterations=iterations, expected=expected, compute_ns=compute, usage_ns=(7, 9))
    d = decide(observe(3.0, sim), ControllerState(), S)
    mem = d.state.sims["a"]
    assert (mem.stage == "profiling") is profiling, name
    assert (len(notes(d, "profile-start")) == 1) is profiling
    assert not resizes(d)
    if profiling:
        assert mem.profile_start_s == 3.0
        assert mem.profile_start == ((0, 0), (0, 0))
        assert mem.profile_start_usage == (7, 9)


# --- (B) profiling -> sized --------------------------------------------------------------


def profiling_state(
    start_s: float = 10.0, n: int = 3, progress_at_start: float = 0.5
) -> ControllerState:
    """Profiling since ``start_s``; by default at ``snap``'s progress (50 %), so only the
    window's length can end it."""
    return state_of(
        a=SimMemory(
            stage="profiling",
            profile_start_s=start_s,
            profile_start=((0, 0),) * n,
            profile_start_usage=(0,) * n,
            profile_start_progress=progress_at_start,
        )
    )


def profiled(
    window_s: float,
    compute: Sequence[float],
    mpi: Sequence[float],
    usage_cores: Sequence[float],
    requests: Sequence[int],
    budget: int = 8000,
) -> SimSnapshot:
    """Counters after ``window_s`` seconds, given in seconds per rank (usage in cores)."""
    return snap(
        requests=requests,
        budget=budget,
        compute_ns=[round(c * GIGA) for c in compute],
        mpi_ns=[round(m * GIGA) for m in mpi],
        usage_ns=[round(u * window_s * GIGA) for u in usage_cores],
    )


@pytest.mark.parametrize(
    ("name", "now_s", "sized"),
    [
        ("window not over", 14.9, False),
        ("window just over", 15.0, True),
        ("long after", 40.0, True),
    ],
)
def test_profiling_window_length_is_respected(name: str, now_s: float, sized: bool) -> None:
    sim = profiled(5.0, [1, 1, 1], [4, 4, 4], [1, 1, 1], [1000] * 3)
    d = decide(observe(now_s, sim), profiling_state(10.0), S)
    assert (d.state.sims["a"].stage == "sized") is sized, name
    assert bool(resizes(d)) is sized


@pytest.mark.parametrize(
    ("name", "now_s", "progress_at_start", "progress", "sized"),
    [
        ("10 % of the run profiled in 2 s", 12.0, 0.1, 0.2, True),
        ("9 % profiled", 12.0, 0.1, 0.19, False),
        ("a whole short run in 0.5 s: below the minimum window", 10.5, 0.1, 0.9, False),
        ("minimum window reached", 11.0, 0.1, 0.9, True),
    ],
)
def test_short_runs_are_profiled_over_a_fraction_of_the_run(
    name: str, now_s: float, progress_at_start: float, progress: float, sized: bool
) -> None:
    sim = profiled(now_s - 10.0, [1, 1, 1], [4, 4, 4], [1, 1, 1], [1000] * 3)
    sim = replace(sim, iterations=round(progress * 1000), expected_iterations=1000)
    d = decide(observe(now_s, sim), profiling_state(10.0, progress_at_start=progress_at_start), S)
    assert (d.state.sims["a"].stage == "sized") is sized, name
    assert bool(resizes(d)) is sized


@dataclass(frozen=True)
class SizeCase:
    name: str
    compute: tuple[float, ...]
    mpi: tuple[float, ...]
    usage_cores: tuple[float, ...]
    requests: tuple[int, ...]
    expected: tuple[int, ...]
    budget: int = 8000
    capacity: int = 8000


SIZE_CASES = [
    # duty 0.2, 0.8, 0.02 of 1 core each: compute 200m, 800m, 20m; x1.25 -> 250, 1000, 25->50
    SizeCase(
        "shrink to duty-proportional",
        (1, 4, 0.1),
        (4, 1, 4.9),
        (1, 1, 1),
        (1000, 1000, 1000),
        (250, 1000, 50),
    ),
    # half a core of usage: 0.5 x 0.5 = 250m -> 313 (ceil 312.5)
    SizeCase(
        "usage scales compute", (2.5, 2.5, 2.5), (2.5, 2.5, 2.5), (0.5,) * 3, (900,) * 3, (313,) * 3
    ),
    SizeCase("zero duty gets the floor", (0, 0, 0), (5, 5, 5), (1, 1, 1), (700,) * 3, (50,) * 3),
    SizeCase(
        "no data at all: duty 1.0", (0, 0, 0), (0, 0, 0), (0.4, 0.4, 0.4), (100,) * 3, (500,) * 3
    ),
    # targets 1250, 1250, 250 = 2750 > 2000 -> 2000 split 5:5:1 exactly
    SizeCase(
        "budget cap, exact sum",
        (5, 5, 1),
        (0, 0, 4),
        (1, 1, 1),
        (1000, 1000, 1000),
        (909, 909, 182),
        budget=2000,
    ),
    # targets 1250 x 3 = 3750; only 3000 + 500 unrequested -> 3500 split evenly
    SizeCase(
        "capacity cap",
        (5, 5, 5),
        (0, 0, 0),
        (1, 1, 1),
        (1000,) * 3,
        (1167, 1167, 1166),
        capacity=3500,
    ),
    SizeCase(
        "budget cap keeps floors",
        (5, 0, 0),
        (0, 5, 5),
        (1, 1, 1),
        (1000,) * 3,
        (200, 50, 50),
        budget=300,
    ),
]


@pytest.mark.parametrize("case", SIZE_CASES, ids=lambda c: c.name)
def test_sizing_after_profiling(case: SizeCase) -> None:
    sim = profiled(5.0, case.compute, case.mpi, case.usage_cores, case.requests, case.budget)
    d = decide(observe(15.0, sim, capacity=case.capacity), profiling_state(10.0), S)
    after = apply([sim], d.actions)[0]
    assert tuple(r.request_millis for r in after.ranks) == case.expected
    assert all(r.kind == "size" and "duty" in r.reason for r in resizes(d))
    # only ranks that change are resized
    assert len(resizes(d)) == sum(e != r for e, r in zip(case.expected, case.requests, strict=True))
    assert sum(case.expected) <= case.budget
    assert d.state.sims["a"].stage == "sized"


def test_budget_cap_sums_exactly_to_the_budget() -> None:
    sim = profiled(5.0, (5, 3, 1), (0, 2, 4), (1, 1, 1), (1000,) * 3, budget=1001)
    d = decide(observe(15.0, sim), profiling_state(10.0), S)
    after = apply([sim], d.actions)[0]
    assert after.requested_millis == 1001


def test_duty_is_stored() -> None:
    sim = profiled(5.0, (1, 4, 0), (4, 1, 0), (1, 1, 1), (1000,) * 3)
    d = decide(observe(15.0, sim), profiling_state(10.0), S)
    assert d.state.sims["a"].duty == pytest.approx((0.2, 0.8, 1.0))


def test_decreases_are_emitted_before_increases() -> None:
    sim = profiled(5.0, (5, 0, 0), (0, 5, 5), (1, 1, 1), (500, 1000, 1000))
    d = decide(observe(15.0, sim, capacity=2500), profiling_state(10.0), S)
    assert [r.request_millis for r in resizes(d)] == [50, 50, 1250]


def test_idempotence() -> None:
    sim = profiled(5.0, (1, 4, 0.1), (4, 1, 4.9), (1, 1, 1), (1000,) * 3)
    obs = observe(15.0, sim)
    first = decide(obs, profiling_state(10.0), S)
    assert resizes(first)
    second = decide(obs, first.state, S)
    assert not resizes(second)
    # already at the targets: nothing to resize even on the first sizing
    already = profiled(5.0, (1, 4, 0.1), (4, 1, 4.9), (1, 1, 1), (250, 1000, 50))
    d = decide(observe(15.0, already), profiling_state(10.0), S)
    assert not resizes(d)
    assert d.state.sims["a"].stage == "sized"


def test_floors_that_do_not_fit_leave_requests_unchanged() -> None:
    sim = profiled(5.0, (5, 5, 5), (0, 0, 0), (1, 1, 1), (40, 40, 40), budget=100)
    d = decide(observe(15.0, sim), profiling_state(10.0), S)
    assert not resizes(d)
    assert notes(d, "resize-skipped")
    assert d.state.sims["a"].stage == "sized"


def test_size_reason_names_duty_and_numbers() -> None:
    sim = profiled(5.0, (1, 4, 0.1), (4, 1, 4.9), (1, 1, 1), (1000,) * 3)
    d = decide(observe(15.0, sim), profiling_state(10.0), S)
    assert resizes(d)[0].reason == (
        "duty 0.200 over 5 s: compute 200m x headroom 1.25 -> 250m (was 1000m)"
    )


def test_losing_shim_data_restarts_the_warmup() -> None:
    sim = snap(requests=(1000,) * 3, compute_ns=(1, None, 1))
    d = decide(observe(15.0, sim), profiling_state(10.0), S)
    assert d.state.sims["a"].stage == "warmup"
    assert notes(d, "profile-restart")
    assert not resizes(d)


def test_full_pipeline_from_warmup_to_sized() -> None:
    state = ControllerState()
    kinds: list[str] = []
    for t in range(12):
        sim = snap(
            requests=(1000, 1000),
            iterations=10 + t,
            compute_ns=(t * GIGA // 10, t * GIGA // 2),
            mpi_ns=(t * 9 * GIGA // 10, t * GIGA // 2),
            usage_ns=(t * GIGA, t * GIGA),
        )
        d = decide(observe(float(t), sim), state, S)
        state = d.state
        kinds += [a.kind for a in d.actions if isinstance(a, Note | Resize)]
    assert kinds == ["profile-start", "size", "size"]
    assert state.sims["a"].duty == pytest.approx((0.1, 0.5))


# --- phases ------------------------------------------------------------------------------

PHASES = (
    Phase(0.0, (1000, 1000, 1000, 1000)),
    Phase(0.3, (600, 600, 600, 600)),
    Phase(0.7, (300, 300, 100, 300)),
)


@pytest.mark.parametrize(
    ("name", "progress", "expected"),
    [
        (
            "three phases in order",
            (0, 10, 29, 30, 50, 70, 90),
            [1000, None, None, 600, None, 300, None],
        ),
        ("skipping ahead", (0, 80), [1000, 300]),
        ("starting late", (45, 75), [600, 300]),
        ("never backwards", (0, 75, 20, 40, 0), [1000, 300, None, None, None]),
    ],
)
def test_phase_transitions(
    name: str, progress: tuple[int, ...], expected: list[int | None]
) -> None:
    sim = snap(requests=(800, 800, 800, 800), phases=PHASES, iterations=0)
    state = ControllerState()
    for t, (p, want) in enumerate(zip(progress, expected, strict=True)):
        sim = replace(sim, iterations=p)
        d = decide(observe(float(t), sim), state, S)
        state = d.state
        rs = resizes(d)
        assert all(r.kind == "phase" for r in rs), name
        sim = apply([sim], d.actions)[0]
        if want is None:
            assert not rs, (name, t)
        else:
            assert rs, (name, t)
            assert sim.ranks[0].request_millis == want, (name, t)
    assert state.sims["a"].stage == "scheduled"


def test_phase_resizes_only_changed_ranks_and_respects_floor() -> None:
    sim = snap(requests=(300, 300, 300, 300), phases=(Phase(0.0, (300, 300, 10, 400)),))
    d = decide(observe(0.0, sim), ControllerState(), S)
    assert [(r.rank, r.request_millis) for r in resizes(d)] == [(2, 50), (3, 400)]


def test_phase_capped_by_budget() -> None:
    sim = snap(requests=(100, 100), budget=1000, phases=(Phase(0.0, (2000, 2000)),))
    d = decide(observe(0.0, sim), ControllerState(), S)
    assert [r.request_millis for r in resizes(d)] == [500, 500]
