"""The simulated backend's model: contention, duty cycles, resizes, faults, determinism.

Everything runs in virtual time (no sleeps); each test takes milliseconds.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rankpack.backend.protocol import (
    RankResources,
    ResizeState,
    ShimSpec,
    SimObservation,
    SimPhase,
    SimSpec,
    StageSpec,
    UnknownSimulation,
)
from rankpack.case.foamlog import LogParser
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import (
    RankFault,
    ResizeScript,
    SimNode,
    SimTiming,
    SimulatedCase,
    cpu_speeds,
    split_cells,
)
from rankpack.testing.simulated import SimulatedBackend

INSTANT = SimTiming(stage_s=0.0, start_s=0.0, resize_latency_s=0.0)


def cluster(
    *cases: SimulatedCase,
    cores: int = 4,
    timing: SimTiming = INSTANT,
    nodes: tuple[SimNode, ...] | None = None,
) -> SimulatedCluster:
    return SimulatedCluster(
        nodes=nodes or (SimNode("n0", cores * 1000),),
        cases=cases,
        timing=timing,
        create_run_dirs=False,
    )


def start(
    b: SimulatedBackend,
    sim_id: str,
    case: str,
    requests: tuple[int, ...],
    *,
    weights: tuple[float, ...] = (),
    shim: ShimSpec | None = None,
    iterations: int | None = None,
) -> SimSpec:
    """Stage and launch; with INSTANT timing the ranks run at once."""
    b.stage(
        StageSpec(
            sim_id,
            case,
            len(requests),
            Path("/nonexistent/runs"),
            iterations=iterations,
            decompose="weighted" if weights else "equal",
            decompose_weights=weights,
        )
    )
    while b.observe(sim_id).phase is SimPhase.STAGING:
        b.wait(1.0)
    staged = b.observe(sim_id).staged
    assert staged is not None
    spec = SimSpec(
        sim_id,
        staged.run_dir,
        ("simpleFoam", "-parallel"),
        tuple(RankResources(m) for m in requests),
        staged.log_path,
        shim=shim,
    )
    b.launch(spec)
    return spec


def run_to_end(b: SimulatedBackend, sim_id: str, tick_s: float = 1.0) -> SimObservation:
    for _ in range(100_000):
        obs = b.observe(sim_id)
        if obs.phase.ended:
            return obs
        b.wait(tick_s)
    raise AssertionError("did not end")


# --- pure formulas -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "weights", "caps", "expected"),
    [
        pytest.param(2, [1000] * 4, [1.0] * 4, [0.5] * 4, id="equal-share"),
        pytest.param(4, [1000] * 2, [1.0] * 2, [1.0, 1.0], id="capped-at-one-core"),
        pytest.param(1, [750, 250], [1.0, 1.0], [0.75, 0.25], id="proportional"),
        pytest.param(3, [2000, 500, 500], [1.0] * 3, [1.0, 1.0, 1.0], id="water-filling"),
        pytest.param(2, [2000, 500, 500], [1.0] * 3, [1.0, 0.5, 0.5], id="cap-then-split"),
        pytest.param(2, [1000, 1000], [0.25, 1.0], [0.25, 1.0], id="limit-caps"),
    ],
)
def test_cpu_speeds(
    cores: float, weights: list[float], caps: list[float], expected: list[float]
) -> None:
    assert cpu_speeds(cores, weights, caps) == pytest.approx(expected)


def test_split_cells_is_proportional_with_an_exact_sum() -> None:
    assert split_cells(1000, [1, 1, 1]) == (334, 333, 333)
    assert split_cells(1000, [3, 1]) == (750, 250)
    assert sum(split_cells(12225, [0.7, 1.1, 2.9])) == 12225


# --- contention and duty cycles ----------------------------------------------------------


def test_four_equal_ranks_on_two_cores_take_twice_their_work_per_iteration() -> None:
    # 400 cells / 4 ranks x 1 ms = 0.1 s of work per rank per iteration
    b = SimulatedBackend(cluster(SimulatedCase("c", 400, 50, cell_work_s=1e-3), cores=2))
    start(b, "s", "c", (1000,) * 4, shim=ShimSpec())
    b.wait(3.0)
    mid = b.observe("s")
    assert [r.duty_window for r in mid.ranks] == pytest.approx([1.0] * 4)
    obs = run_to_end(b, "s", tick_s=100.0)
    assert obs.phase is SimPhase.SUCCEEDED and obs.exit_code == 0
    assert b.clock() == pytest.approx(50 * 2 * 0.1)
    # spinning ranks burn their half core all the time
    assert [r.usage_ns / 1e9 for r in obs.ranks] == pytest.approx([5.0] * 4)


def test_requests_proportional_to_the_work_run_faster() -> None:
    case = SimulatedCase("c", 400, 30, cell_work_s=1e-3)
    durations = []
    for requests in ((500, 500), (750, 250)):
        b = SimulatedBackend(cluster(case, cores=1))
        start(b, "s", "c", requests, weights=(3.0, 1.0))
        run_to_end(b, "s", tick_s=1000.0)
        durations.append(b.clock())
    # equal: T = 0.3 / 0.5 = 0.6 s; proportional: T = 0.3 / 0.75 = 0.1 / 0.25 = 0.4 s
    assert durations == pytest.approx([30 * 0.6, 30 * 0.4])


def test_duty_cycles_and_polite_waiting() -> None:
    b = SimulatedBackend(cluster(SimulatedCase("c", 400, 1000, cell_work_s=1e-3), cores=2))
    start(b, "s", "c", (1000, 1000), weights=(3.0, 1.0), shim=ShimSpec(wait_mode="polite"))
    b.wait(10.0)
    obs = b.observe("s")
    r0, r1 = obs.ranks
    assert r0.duty_window == pytest.approx(1.0)
    assert r1.duty_window == pytest.approx(1 / 3)
    assert r1.compute_ns is not None and r1.mpi_ns is not None
    assert r1.compute_ns / (r1.compute_ns + r1.mpi_ns) == pytest.approx(1 / 3)
    assert r0.usage_ns / 1e9 == pytest.approx(10.0)
    assert r1.usage_ns / 1e9 == pytest.approx(10.0 / 3)
    b.set_wait_mode("s", "spin")
    b.wait(10.0)
    assert b.observe("s").ranks[1].usage_ns / 1e9 == pytest.approx(10.0 / 3 + 10.0)


def test_no_shim_no_shim_counters() -> None:
    b = SimulatedBackend(cluster(SimulatedCase("c", 400, 100)))
    start(b, "s", "c", (1000, 1000))
    b.wait(1.0)
    r = b.observe("s").ranks[0]
    assert r.compute_ns is None and r.mpi_ns is None and r.duty_window is None
    assert r.usage_ns > 0


def test_reserved_millis_compete_for_the_node() -> None:
    nodes = (SimNode("n0", 2000, reserved_millis=1000),)
    b = SimulatedBackend(cluster(SimulatedCase("c", 200, 10, cell_work_s=1e-3), nodes=nodes))
    start(b, "s", "c", (1000, 1000))
    assert b.inventory().nodes[0].requested_millis == 3000
    run_to_end(b, "s", tick_s=100.0)
    # 2 cores shared by weights 1000:1000:1000 -> 2/3 core per rank, 0.1 s of work each
    assert b.clock() == pytest.approx(10 * 0.1 / (2 / 3))
    assert b.inventory().nodes[0].requested_millis == 1000


def test_the_solver_log_is_what_log_parser_reads() -> None:
    b = SimulatedBackend(cluster(SimulatedCase("c", 200, 20, cell_work_s=1e-3)))
    start(b, "s", "c", (1000, 1000))
    parser = LogParser()
    while True:
        obs = b.observe("s")
        parser.feed(obs.log_text)
        if obs.phase.ended:
            break
        b.wait(0.5)
    state = parser.state
    assert state.iterations == 20 and state.time == 20 and state.ended
    assert state.execution_s == pytest.approx(2.0)  # 20 x 0.1 s of rank 0's CPU
    assert [t for _, t in state.iteration_clock] == sorted(t for _, t in state.iteration_clock)
    assert state.fatal is None
    assert b.observe("s").log_text == ""


# --- staging and placement ---------------------------------------------------------------


def test_staging_takes_its_time_and_splits_cells_by_weights(tmp_path: Path) -> None:
    c = SimulatedCluster(
        cases=(SimulatedCase("pitz", 1000, 10),), timing=SimTiming(stage_s=5.0, start_s=2.0)
    )
    b = SimulatedBackend(c)
    b.stage(
        StageSpec(
            "s", "/cases/pitz", 2, tmp_path, decompose="weighted", decompose_weights=(1.0, 3.0)
        )
    )
    assert b.observe("s").phase is SimPhase.STAGING
    b.wait(60.0)
    assert b.clock() == 5.0
    obs = b.observe("s")
    assert obs.phase is SimPhase.STAGED and obs.staged is not None
    assert obs.staged.cells_per_rank == (250, 750)
    assert obs.staged.run_dir.is_dir() and obs.staged.run_dir.parent == tmp_path


def test_an_unknown_case_fails_staging_at_once() -> None:
    b = SimulatedBackend(cluster(SimulatedCase("c", 100, 10)))
    b.stage(StageSpec("s", "nope", 2, Path("/x")))
    obs = b.observe("s")
    assert obs.phase is SimPhase.FAILED
    assert obs.stage_error is not None and "nope" in obs.stage_error and "c" in obs.stage_error
    t0 = b.clock()
    b.wait(30.0)  # the failure is news: wait returns at once
    assert b.clock() == t0


def test_pending_for_the_start_delay_then_running() -> None:
    timing = SimTiming(stage_s=0.0, start_s=3.0, resize_latency_s=0.0)
    b = SimulatedBackend(cluster(SimulatedCase("c", 100, 10), timing=timing))
    start(b, "s", "c", (1000,))
    obs = b.observe("s")
    assert obs.phase is SimPhase.PENDING and obs.ranks[0].allocated is None
    b.wait(60.0)
    assert b.clock() == 3.0
    assert b.observe("s").phase is SimPhase.RUNNING


def test_a_simulation_that_does_not_fit_goes_to_another_node() -> None:
    nodes = (SimNode("a", 2000), SimNode("b", 4000))
    b = SimulatedBackend(cluster(SimulatedCase("c", 100, 1000), nodes=nodes))
    start(b, "one", "c", (1000, 1000))
    start(b, "two", "c", (1000, 1000))
    assert [r.node for r in b.observe("one").ranks] == ["a", "a"]
    assert [r.node for r in b.observe("two").ranks] == ["b", "b"]
    assert [n.requested_millis for n in b.inventory().nodes] == [2000, 2000]


# --- resizes -----------------------------------------------------------------------------


def test_resize_goes_pending_in_progress_completed_with_its_latency() -> None:
    timing = SimTiming(stage_s=0.0, start_s=0.0, resize_latency_s=2.0)
    b = SimulatedBackend(cluster(SimulatedCase("c", 100, 10_000), timing=timing))
    start(b, "s", "c", (1000, 1000))
    status = b.resize("s", 0, RankResources(1500))
    assert status.state is ResizeState.PENDING and status.requested_t_s == 0.0
    states = []
    for _ in range(4):
        b.wait(0.5)
        r0 = b.observe("s").ranks[0]
        assert r0.resize is not None
        states.append(r0.resize.state)
    assert states == [
        ResizeState.PENDING,
        ResizeState.IN_PROGRESS,
        ResizeState.IN_PROGRESS,
        ResizeState.COMPLETED,
    ]
    r0 = b.observe("s").ranks[0]
    assert r0.resize is not None and r0.resize.latency_s == pytest.approx(2.0)
    assert r0.allocated == RankResources(1500)


def test_wait_returns_when_a_resize_settles() -> None:
    timing = SimTiming(stage_s=0.0, start_s=0.0, resize_latency_s=2.5)
    b = SimulatedBackend(cluster(SimulatedCase("c", 100, 10_000), timing=timing))
    start(b, "s", "c", (1000,))
    b.resize("s", 0, RankResources(500))
    b.wait(100.0)
    assert b.clock() == pytest.approx(2.5)


def test_a_request_above_allocatable_is_rejected_at_once() -> None:
    b = SimulatedBackend(cluster(SimulatedCase("c", 100, 10_000), cores=4))
    start(b, "s", "c", (1000, 1000))
    status = b.resize("s", 1, RankResources(4001))
    assert status.state is ResizeState.REJECTED and status.latency_s == 0.0
    assert "4000m" in status.reason
    r1 = b.observe("s").ranks[1]
    assert r1.desired == RankResources(1000) and r1.allocated == RankResources(1000)


def test_an_increase_that_does_not_fit_is_deferred_until_capacity_frees() -> None:
    timing = SimTiming(stage_s=0.0, start_s=0.0, resize_latency_s=1.0)
    b = SimulatedBackend(
        cluster(SimulatedCase("long", 100, 100_000), SimulatedCase("short", 100, 10), timing=timing)
    )
    start(b, "a", "long", (1500, 1500))
    start(b, "b", "short", (1000,))  # the node is full now: 4000m requested
    status = b.resize("a", 0, RankResources(2000))
    assert status.state is ResizeState.DEFERRED and "0m free" in status.reason
    b.wait(0.5)
    assert b.observe("a").ranks[0].allocated == RankResources(1500)
    end_b = run_to_end(b, "b", tick_s=100.0).t_s  # 10 x 0.002 s
    r0 = b.observe("a").ranks[0]
    assert r0.resize is not None and r0.resize.state is ResizeState.IN_PROGRESS
    b.wait(100.0)
    r0 = b.observe("a").ranks[0]
    assert r0.resize is not None and r0.resize.state is ResizeState.COMPLETED
    assert r0.resize.latency_s == pytest.approx(end_b + 1.0)
    assert r0.allocated == RankResources(2000)


def test_a_deferred_increase_proceeds_when_a_decrease_or_a_stop_frees_room() -> None:
    b = SimulatedBackend(
        cluster(SimulatedCase("long", 100, 100_000), cores=4)  # resizes settle at once
    )
    start(b, "a", "long", (2000, 2000))
    assert b.resize("a", 0, RankResources(2500)).state is ResizeState.DEFERRED
    assert b.resize("a", 1, RankResources(1000)).state is ResizeState.COMPLETED
    r0 = b.observe("a").ranks[0]
    assert r0.resize is not None and r0.resize.state is ResizeState.COMPLETED
    start(b, "b", "long", (1000,) * 3)  # overcommitted: 6500m on 4000m
    assert b.resize("a", 1, RankResources(1400)).state is ResizeState.DEFERRED
    b.stop("b")
    r1 = b.observe("a").ranks[1]
    assert r1.resize is not None and r1.resize.state is ResizeState.COMPLETED


def test_scripted_outcomes() -> None:
    timing = SimTiming(stage_s=0.0, start_s=0.0, resize_latency_s=1.0)
    c = cluster(SimulatedCase("c", 100, 100_000), timing=timing)
    b = SimulatedBackend(c)
    start(b, "s", "c", (1000, 1000))
    c.script_resize(ResizeScript(ResizeState.DEFERRED, rank=0, defer_s=4.0))
    c.script_resize(ResizeScript(ResizeState.INFEASIBLE, rank=1, reason="no such CPU"))
    assert b.resize("s", 0, RankResources(1200)).state is ResizeState.DEFERRED
    assert b.resize("s", 1, RankResources(1200)).state is ResizeState.PENDING
    b.wait(10.0)  # rank 1 settles first (infeasible after the latency)
    r1 = b.observe("s").ranks[1]
    assert b.clock() == 1.0 and r1.resize is not None
    assert r1.resize.state is ResizeState.INFEASIBLE and r1.resize.reason == "no such CPU"
    assert r1.allocated == RankResources(1000) and r1.desired == RankResources(1200)
    b.wait(10.0)
    r0 = b.observe("s").ranks[0]
    assert b.clock() == 5.0 and r0.resize is not None
    assert r0.resize.state is ResizeState.COMPLETED and r0.allocated == RankResources(1200)
    c.script_resize(ResizeScript(ResizeState.REJECTED, sim_id="s"))
    assert b.resize("s", 0, RankResources(900)).state is ResizeState.REJECTED
    c.script_resize(ResizeScript(ResizeState.FAILED))
    b.resize("s", 0, RankResources(900))
    b.wait(10.0)
    r0 = b.observe("s").ranks[0]
    assert r0.resize is not None and r0.resize.state is ResizeState.FAILED
    assert b.resize("s", 0, RankResources(900)).state is ResizeState.PENDING  # scripts used up


def test_a_resize_in_flight_fails_when_the_simulation_ends() -> None:
    timing = SimTiming(stage_s=0.0, start_s=0.0, resize_latency_s=10.0)
    b = SimulatedBackend(cluster(SimulatedCase("c", 100, 100_000), timing=timing))
    start(b, "s", "c", (1000,))
    b.resize("s", 0, RankResources(500))
    b.stop("s")
    r0 = b.observe("s").ranks[0]
    assert r0.resize is not None and r0.resize.state is ResizeState.FAILED
    assert b.resize("s", 0, RankResources(700)).state is ResizeState.REJECTED


# --- faults ------------------------------------------------------------------------------


def test_a_rank_failure_fails_the_simulation() -> None:
    c = cluster(SimulatedCase("c", 100, 100_000))
    c.add_fault(RankFault("s", 1, at_s=7.5))
    b = SimulatedBackend(c)
    start(b, "s", "c", (1000, 1000))
    b.wait(100.0)
    assert b.clock() == 7.5
    obs = b.observe("s")
    assert obs.phase is SimPhase.FAILED and obs.exit_code == 1
    assert obs.reason == "rank 1 failed: killed by signal 9"
    parser = LogParser()
    parser.feed(obs.log_text)
    assert parser.state.fatal is not None and "rank 1" in parser.state.fatal


def test_a_restarted_rank_counts_and_loses_its_iteration() -> None:
    case = SimulatedCase("c", 200, 10, cell_work_s=1e-2)  # 1 s per iteration
    c = cluster(case)
    c.add_fault(RankFault("s", 0, at_s=3.5, reason="OOMKilled", restart=True))
    b = SimulatedBackend(c)
    start(b, "s", "c", (1000, 1000))
    obs = run_to_end(b, "s", tick_s=100.0)
    assert obs.phase is SimPhase.SUCCEEDED
    assert [r.restarts for r in obs.ranks] == [1, 0]
    assert b.clock() == pytest.approx(10.5)


# --- backends sharing a cluster ----------------------------------------------------------


def test_a_second_backend_must_adopt_and_then_gets_the_whole_log() -> None:
    c = cluster(SimulatedCase("c", 100, 100_000))
    first = SimulatedBackend(c)
    spec = start(first, "s", "c", (1000,))
    first.wait(2.0)
    assert "Time = 1" in first.observe("s").log_text
    second = SimulatedBackend(c)
    assert [r.sim_id for r in second.list()] == ["s"]
    with pytest.raises(UnknownSimulation):
        second.observe("s")
    second.adopt("s", spec)
    assert "Time = 1" in second.observe("s").log_text
    second.release("s")
    with pytest.raises(UnknownSimulation):
        first.observe("s")
    with pytest.raises(UnknownSimulation):
        second.adopt("s", spec)


# --- determinism and speed ---------------------------------------------------------------


def scenario() -> list[SimObservation]:
    timing = SimTiming(stage_s=2.0, start_s=1.5, resize_latency_s=0.7)
    c = cluster(SimulatedCase("c", 777, 60, cell_work_s=3e-4), cores=2, timing=timing)
    c.add_fault(RankFault("b", 1, at_s=9.3, restart=True))
    b = SimulatedBackend(c)
    start(b, "a", "c", (900, 400, 700), shim=ShimSpec())
    start(b, "b", "c", (1000, 1000), weights=(2.0, 1.0), shim=ShimSpec(wait_mode="polite"))
    seen = []
    for tick in range(200):
        for sim_id in ("a", "b"):
            seen.append(b.observe(sim_id))
        if tick == 5:
            b.resize("a", 1, RankResources(1200))
        b.wait(0.5)
    return seen


def test_the_model_is_deterministic() -> None:
    assert scenario() == scenario()


def test_a_300_s_run_at_1_s_ticks_takes_well_under_a_second() -> None:
    case = SimulatedCase("c", 12_000, 300, cell_work_s=2.5e-4)  # 1 s per iteration on 3 ranks
    b = SimulatedBackend(cluster(case))
    t0 = time.perf_counter()
    start(b, "s", "c", (1000, 1000, 1000), shim=ShimSpec())
    obs = run_to_end(b, "s", tick_s=1.0)
    elapsed = time.perf_counter() - t0
    assert obs.phase is SimPhase.SUCCEEDED and b.clock() == pytest.approx(300.0)
    assert elapsed < 0.25, f"{elapsed:.3f} s of real time"
