"""A tick that costs what changed (issue 29): the loop observes what is under way every
tick and the steady simulations in turn within a budget of ranks; a simulation not
observed again is not decided on again. Virtual time (the simulated backend)."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rankpack.backend.protocol import SimObservation
from rankpack.controller.decision import ControllerSettings, ControllerState, SimMemory
from rankpack.controller.jobs import Job, StoreQueue
from rankpack.controller.loop import run_jobs
from rankpack.controller.outcomes import keep_mark, steady_duty
from rankpack.controller.policy import decide
from rankpack.controller.schedule import Schedule
from rankpack.controller.tracked import LoopSettings, Tracked
from rankpack.plan.submission import Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimTiming, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

from ._helpers import GIGA, observe, snap


def _tracked(sim_id: str, ranks: int) -> Tracked:
    sub = Submission(case="box", weights=(1.0,) * ranks, budget_millis=1000 * ranks)
    return Tracked(job=Job(0, sub), sim_id=sim_id, plan=sub.plan(), queued_s=0.0,
                   wait_setting="spin")  # fmt: skip


def test_under_the_budget_every_simulation_is_observed_every_tick() -> None:
    sims = {f"s{i}": _tracked(f"s{i}", 4) for i in range(5)}
    schedule = Schedule(budget_ranks=20, max_age_s=10.0)
    for t in range(3):
        assert schedule.pick(sims, set(), set(), float(t)) == list(sims.values())


def test_over_the_budget_the_steady_ones_take_turns_and_none_waits_past_its_age() -> None:
    sims = {f"s{i}": _tracked(f"s{i}", 4) for i in range(10)}  # 40 ranks
    schedule = Schedule(budget_ranks=12, max_age_s=5.0)
    seen: Counter[str] = Counter()
    last: dict[str, float] = {}
    gaps: list[float] = []
    for t in range(30):
        chosen = schedule.pick(sims, {"s9"}, {"s8"}, float(t))
        ids = [s.sim_id for s in chosen]
        assert "s9" in ids and "s8" in ids  # urgent always; active first
        # within the budget, but for those that have waited their max age
        old = [i for i in ids if t - last.get(i, -99.0) >= 5.0]
        assert sum(len(sims[i].plan.ranks) for i in ids if i not in old) <= 12
        assert ids == [i for i in sims if i in ids]  # in the loop's order
        for i in ids:
            if i in last:
                gaps.append(t - last[i])
            last[i] = float(t)
            seen[i] += 1
    assert seen["s9"] == 30 and seen["s8"] == 30
    assert all(seen[f"s{i}"] <= 10 for i in range(8))  # steady ones: in turn
    assert max(gaps) <= 5.0  # and none older than max_age_s


def test_a_snapshot_not_observed_again_is_not_decided_on_again() -> None:
    # a simulation in warm-up whose (old) snapshot shows it past the warm-up: observed
    # for an earlier step, it is not decided on (no profile start, no rate mark)
    sim = replace(snap("a", iterations=50, expected=100), observed_s=9.0)
    state = ControllerState(sims={"a": SimMemory(stage="warmup", rate_marks=((9.0, 50),))})
    d = decide(observe(10.0, sim), state, ControllerSettings())
    assert d.actions == () and d.state.sims["a"] == state.sims["a"]
    # observed for this step, it is
    d = decide(observe(10.0, replace(sim, observed_s=10.0)), state, ControllerSettings())
    assert d.state.sims["a"].stage == "profiling"
    assert d.state.sims["a"].rate_marks == ((9.0, 50), (10.0, 50))


def test_rate_marks_restart_at_the_time_a_snapshot_was_observed() -> None:
    # a resize restarts every simulation's rate marks: a stale one's at its observation
    a = snap("a", (1000, 1000), iterations=50, usage_ns=(5 * GIGA,) * 2,
             compute_ns=(GIGA, GIGA), mpi_ns=(4 * GIGA, 4 * GIGA))  # fmt: skip
    b = replace(snap("b", iterations=30), observed_s=7.0)
    mems = {
        "a": SimMemory(stage="profiling", profile_start_s=0.0, profile_start=((0, 0),) * 2,
                       profile_start_usage=(0, 0)),
        "b": SimMemory(stage="sized", duty=(0.5, 0.5), rate_marks=((7.0, 30),)),
    }  # fmt: skip
    d = decide(observe(10.0, a, b), ControllerState(sims=mems), ControllerSettings())
    assert d.state.sims["b"].rate_marks == ((7.0, 30),)
    assert d.state.sims["a"].rate_marks == ((10.0, 50),)


class Counting(SimulatedBackend):
    """Counts the observations of each simulation, per tick."""

    def __init__(self, cluster: SimulatedCluster) -> None:
        super().__init__(cluster)
        self.ticks: list[list[str]] = [[]]

    def observe(self, sim_id: str) -> SimObservation:
        self.ticks[-1].append(sim_id)
        return super().observe(sim_id)

    def wait(self, timeout_s: float) -> None:
        self.ticks.append([])
        super().wait(timeout_s)


def test_on_a_large_cluster_a_tick_observes_a_slice_and_an_end_at_once(tmp_path: Path) -> None:
    case = SimulatedCase("box", cells=8000, iterations=60, cell_work_s=5e-4)
    cluster = SimulatedCluster(
        nodes=tuple(SimNode(f"n{i}", 4000) for i in range(4)), cases=(case,),
        timing=SimTiming(stage_s=0.0, start_s=0.0, resize_latency_s=0.0),
    )  # fmt: skip
    store = Store(tmp_path / "r.db")
    sub = Submission(case="box", weights=(1.0,) * 4, budget_millis=4000, sizing="fixed")
    store.submit_many("box", 4, sub.to_json(), 4)
    backend = Counting(cluster)
    settings = LoopSettings(
        runs_root=tmp_path / "runs", shim=True, observe_ranks_per_tick=8,
        observe_max_age_s=5.0,
        controller=ControllerSettings(max_concurrent=4, launch_cooldown_s=0.0,
                                      min_predicted_gain=-1.0, launch_must_fit=True),
    )  # fmt: skip
    result = run_jobs(backend, store, StoreQueue(store, None), settings)
    assert [r.status for r in result.results] == ["completed"] * 4
    assert result.max_concurrent_seen == 4
    steady = [t for t in backend.ticks if len(t) > 0]
    # 4 simulations of 4 ranks, 8 ranks a tick: most ticks observe 2 of them, not 4
    assert sum(1 for t in steady if len(t) <= 2) > len(steady) / 2
    # every simulation was observed at least every 5 s of its run (ticks are ~1 s)
    for run in result.results:
        sim_id = str(store.get_run(run.id).options["sim_id"])
        at = [i for i, t in enumerate(backend.ticks) if sim_id in t]
        assert max(b - a for a, b in itertools.pairwise(at)) <= 6
    # each end was seen within a tick of happening (the backend says which changed)
    for run in result.results:
        assert run.iterations == 60 and abs(run.wall_s - 60 * 1.0) < 2.5


@settings(max_examples=200, deadline=None)
@given(
    expected=st.integers(1, 200),
    steps=st.lists(st.tuples(st.integers(0, 10), st.integers(0, GIGA), st.integers(0, GIGA)),
                   max_size=60),
)  # fmt: skip
def test_a_rank_keeps_three_duty_marks_and_the_same_steady_duty(
    expected: int, steps: list[tuple[int, int, int]]
) -> None:
    full: list[tuple[int, int, int]] = []
    kept: list[tuple[int, int, int]] = []
    it = compute = mpi = 0
    for di, dc, dm in steps:
        it, compute, mpi = it + di, compute + dc, mpi + dm
        full.append((it, compute, mpi))
        keep_mark(kept, (it, compute, mpi), expected)
        assert len(kept) <= 3
    assert steady_duty(kept, expected) == steady_duty(full, expected)
