"""The decision step on stale readings (issue 27, item 5): a simulation any of whose ranks
could not be read this step (``RankSnapshot.readings_ok`` False: its node agent is away)
gets no Resize and no SetWaitMode of any kind, and carries on once it is read again.

The clock is fake: it is only the ``now_s`` passed in the observations.
"""

from __future__ import annotations

from dataclasses import replace

from rankpack.controller.decision import ControllerState, QueuedSim, SimMemory, SimSnapshot
from rankpack.controller.policy import decide
from rankpack.core.actions import SetWaitMode
from rankpack.plan.submission import Phase

from ._helpers import GIGA, SIZED, S, launches, observe, resizes, snap, state_of


def stale(sim: SimSnapshot, *ranks: int) -> SimSnapshot:
    """``sim`` with the given ranks' readings missing (all when none are given)."""
    which = set(ranks) or {r.rank for r in sim.ranks}
    return replace(sim, ranks=tuple(replace(r, readings_ok=r.rank not in which)
                                    for r in sim.ranks))  # fmt: skip


def test_one_stale_rank_makes_the_simulation_stale() -> None:
    sim = snap()
    assert sim.readings_ok
    assert not stale(sim, 1).readings_ok


def test_no_sizing_on_stale_readings_and_the_window_is_measured_whole_once_fresh() -> None:
    profiling = state_of(a=SimMemory(stage="profiling", profile_start_s=10.0,
                                     profile_start=((0, 0),) * 2, profile_start_usage=(0, 0),
                                     profile_start_progress=0.5))  # fmt: skip
    counters = {"compute_ns": [GIGA, GIGA], "mpi_ns": [3 * GIGA, 3 * GIGA],
                "usage_ns": [8 * GIGA, 8 * GIGA]}  # fmt: skip
    sim = snap(**counters)  # type: ignore[arg-type]
    d = decide(observe(16.0, stale(sim, 0)), profiling, S)
    assert resizes(d) == [] and d.state.sims["a"].stage == "profiling"
    d = decide(observe(18.0, sim), d.state, S)  # read again: 8 s of window, all of it
    assert d.state.sims["a"].stage == "sized"
    # duty 0.25 of 8 s of usage over an 8 s window: 250m x 1.25 headroom
    assert [r.request_millis for r in resizes(d)] == [313, 313]


def test_no_profiling_starts_on_stale_readings() -> None:
    d = decide(observe(3.0, stale(snap(iterations=50))), ControllerState(), S)
    assert d.state.sims["a"].stage == "warmup" and d.actions == ()


def test_no_phase_resize_on_stale_readings() -> None:
    sim = snap(phases=(Phase(0.1, (500, 500)),))
    d = decide(observe(0.0, stale(sim)), state_of(a=SimMemory(stage="scheduled")), S)
    assert resizes(d) == []
    assert [r.request_millis for r in resizes(decide(observe(1.0, sim), d.state, S))] == [500, 500]


def _rated(sim_id: str, requests: tuple[int, ...], rate_per_s: float) -> SimSnapshot:
    return snap(sim_id, requests, iterations=round(rate_per_s * 6 * 100_000), expected=100_000)


def test_fairness_leaves_a_stale_simulation_alone() -> None:
    mem = replace(SIZED, duty=(0.1,) * 4, rate_marks=((94.0, 0),))
    slow, fast = _rated("a", (250,) * 4, 0.005), _rated("b", (500,) * 4, 0.01)
    state = state_of(a=mem, b=mem)
    assert resizes(decide(observe(100.0, slow, fast), state, S))  # fresh: a is raised
    assert resizes(decide(observe(100.0, stale(slow, 2), fast), state, S)) == []
    assert resizes(decide(observe(100.0, slow, stale(fast, 0)), state, S)) == []


def test_no_wait_mode_switch_on_stale_readings() -> None:
    a = replace(snap("a", (500, 500)), wait="auto")
    b = replace(snap("b", (500, 500)), wait="auto")
    fixed = state_of(a=SimMemory(stage="fixed"), b=SimMemory(stage="fixed"))
    d = decide(observe(0.0, stale(a, 1), b, capacity=2000), fixed, S)
    switches = [(x.sim_id, x.mode) for x in d.actions if isinstance(x, SetWaitMode)]
    assert switches == [("b", "polite")]  # a's ranks outnumber the cores too, but it is stale
    d = decide(observe(1.0, a, b, capacity=2000), d.state, S)
    assert [(x.sim_id, x.mode) for x in d.actions if isinstance(x, SetWaitMode)] == [
        ("a", "polite")
    ]


def test_no_pack_while_a_running_simulation_is_stale() -> None:
    ns = [round(0.33 * GIGA), round(0.97 * GIGA)]
    sim = snap("a", (459, 1217), compute_ns=ns, mpi_ns=[GIGA - c for c in ns])
    state = state_of(a=replace(SIZED, duty=(0.33, 0.97)))
    queue = (QueuedSim(9, 2, (459, 1217), (0.33, 0.97)),)
    settings = replace(S, colocation_efficiency=0.87)
    fresh = decide(observe(100.0, sim, queue=queue, capacity=2000), state, settings)
    assert [r.kind for r in resizes(fresh)] == ["pack", "pack"] and launches(fresh)
    held = decide(observe(100.0, stale(sim, 0), queue=queue, capacity=2000), state, settings)
    assert resizes(held) == [] and launches(held) == []
