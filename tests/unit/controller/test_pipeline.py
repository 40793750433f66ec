"""The launch pipeline (issue 29): on a cluster of several nodes the gate launches as many
simulations as the open room, the launch rate and the launches in flight allow, in the
queue's order, with the backfill's ageing kept; one node keeps one launch at a time.
The clock is fake: only the ``now_s`` passed in the observations."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from rankpack.controller.decision import (
    ControllerSettings,
    ControllerState,
    NodeCores,
    Observations,
    QueuedSim,
    SimMemory,
)
from rankpack.controller.policy import decide

from ._helpers import launches, observe, queued, running_on

CORES = 8000
S = ControllerSettings(max_concurrent=1000, launch_must_fit=True)


def nodes(n: int, **placed: int) -> tuple[NodeCores, ...]:
    """``n`` nodes of 8 cores; ``placed``: this loop's millicores already on a node."""
    return tuple(
        NodeCores(f"n{i}", CORES, ours_ranks=placed.get(f"n{i}", 0) // 1000,
                  ours_millis=placed.get(f"n{i}", 0))
        for i in range(n)
    )  # fmt: skip


def test_an_empty_cluster_takes_a_burst_of_launches_in_the_queues_order() -> None:
    obs = observe(0.0, queue=[queued(i) for i in range(1, 11)], nodes=nodes(10))
    d = decide(obs, ControllerState(), S)
    assert [a.queue_id for a in launches(d)] == [1, 2, 3, 4]  # launch_burst
    assert launches(d)[0].reason.startswith("nothing is running")
    assert all(a.reason.startswith("pipeline:") for a in launches(d)[1:])
    assert d.state.launch_bucket == (0.0, 0.0)


def test_the_rate_refills_the_bucket_and_the_pipeline_goes_on() -> None:
    cluster = nodes(10, n0=8000, n1=8000, n2=8000, n3=8000)
    sims = [running_on(f"s{i}", f"n{i}", started_s=0.0) for i in range(4)]
    state = ControllerState(
        sims={s.sim_id: SimMemory(stage="warmup") for s in sims},
        last_launch_s=0.0,
        launch_bucket=(0.0, 0.0),
    )
    queue = [queued(i) for i in range(5, 11)]
    # 2.5 s later: 2 launches' worth of rate (1/s); the running ones are still warming up
    # on whole cores, so they close nothing
    d = decide(observe(2.5, *sims, queue=queue, nodes=cluster), state, S)
    assert [a.queue_id for a in launches(d)] == [5, 6]
    assert d.state.launch_bucket == (0.5, 2.5)


def test_launches_in_flight_are_bounded() -> None:
    cluster = nodes(10)
    starting = [replace(running_on(f"s{i}", None, started_s=-10.0), starting=True)  # type: ignore[arg-type]
                for i in range(7)]  # fmt: skip
    state = ControllerState(sims={s.sim_id: SimMemory(stage="warmup") for s in starting})
    queue = [queued(i, ranks=1) for i in range(1, 6)]
    d = decide(observe(10.0, *starting, queue=queue, nodes=cluster), state, S)
    assert [a.queue_id for a in launches(d)] == [1]  # max_starting 8: one more in flight


def test_a_node_that_took_a_launch_is_closed_for_the_cooldown() -> None:
    # two nodes: n0 has a simulation launched 1 s ago (cooldown 2 s), n1 is free
    cluster = nodes(2, n0=4000)
    sim = running_on("a", "n0", ranks=4, started_s=9.0)
    state = ControllerState(sims={"a": SimMemory(stage="warmup")}, last_launch_s=9.0)
    queue = [queued(1, ranks=4), queued(2, ranks=4)]
    d = decide(observe(10.0, sim, queue=queue, nodes=cluster), state, S)
    # only n1's 8 cores are open: one simulation of 4 cores fits, then another does too
    assert [a.queue_id for a in launches(d)] == [1, 2]
    d = decide(observe(10.0, sim, queue=[queued(1, ranks=12)], nodes=cluster), state, S)
    assert launches(d) == []  # 12 cores do not fit n1's 8 (n0's 4 free are closed)
    d = decide(observe(11.0, sim, queue=[queued(1, ranks=12)], nodes=cluster), state, S)
    assert [a.queue_id for a in launches(d)] == [1]  # the cooldown is over: both open


def test_a_rank_fits_one_node_or_the_simulation_does_not_fit() -> None:
    # 3 nodes with 1 core free each, the simulations there still warming up on whole
    # cores: 3 cores free in all, but a 2-core rank fits none of them
    cluster = nodes(3, n0=7000, n1=7000, n2=7000)
    sims = [running_on(f"s{i}", f"n{i}", ranks=7) for i in range(3)]
    state = ControllerState(sims={s.sim_id: SimMemory(stage="warmup") for s in sims},
                            last_launch_s=0.0)  # fmt: skip
    wide = QueuedSim(queue_id=1, n_ranks=1, initial_request_millis=(2000,))
    d = decide(observe(100.0, *sims, queue=[wide], nodes=cluster), state, S)
    assert launches(d) == []
    d = decide(observe(100.0, *sims, queue=[queued(2, ranks=3)], nodes=cluster), state, S)
    assert [a.queue_id for a in launches(d)] == [2]


def test_a_simulation_measured_on_borrowed_cpu_closes_its_nodes_one_on_whole_cores_does_not() -> (
    None
):
    cluster = nodes(2, n0=4000, n1=4000)
    borrowing = running_on("b", "n0", ranks=8, millis=500)  # 8 ranks, 4 cores requested
    whole = running_on("w", "n1", ranks=4, millis=1000)
    state = ControllerState(
        sims={"b": SimMemory(stage="profiling", profile_start_s=90.0),
              "w": SimMemory(stage="profiling", profile_start_s=90.0)},
        last_launch_s=0.0,
    )  # fmt: skip
    d = decide(observe(91.0, borrowing, whole, queue=[queued(1, ranks=4)], nodes=cluster),
               state, replace(S, profile_s=60.0))  # fmt: skip
    (launch,) = launches(d)  # into n1's 4 free cores, beside the whole-core one
    assert launch.reason.startswith("pipeline:")
    d = decide(observe(91.0, borrowing, whole, queue=[queued(1, ranks=6)], nodes=cluster),
               state, replace(S, profile_s=60.0))  # fmt: skip
    assert launches(d) == []  # 6 cores would need n0's room: closed while b is measured


def test_one_node_keeps_one_launch_at_a_time_after_everything_is_measured() -> None:
    one = (NodeCores("n0", 64000),)
    sim = running_on("a", "n0", ranks=8)
    state = ControllerState(sims={"a": SimMemory(stage="warmup")}, last_launch_s=0.0)
    queue = [queued(i) for i in range(1, 5)]
    d = decide(observe(100.0, sim, queue=queue, nodes=one), state, S)
    assert launches(d) == []  # measuring: the gate as it always was on one node
    state = ControllerState(sims={"a": SimMemory(stage="sized", duty=(0.9,) * 8)},
                            last_launch_s=0.0)  # fmt: skip
    d = decide(observe(100.0, sim, queue=queue, nodes=one), state, S)
    assert [a.queue_id for a in launches(d)] == [1]


def test_the_gain_a_launch_needs_is_a_share_of_one_simulation() -> None:
    # 40 simulations running, everything fits: one more adds 1/40 of the throughput,
    # below a 5 % relative gain but a whole simulation's worth: the pipeline launches it
    cluster = nodes(50, **{f"n{i}": 8000 for i in range(40)})
    sims = [running_on(f"s{i}", f"n{i}") for i in range(40)]
    state = ControllerState(
        sims={s.sim_id: SimMemory(stage="sized", duty=(0.9,) * 8) for s in sims},
        last_launch_s=0.0,
    )
    d = decide(observe(100.0, *sims, queue=[queued(1)], nodes=cluster), state, S)
    (launch,) = launches(d)
    assert "(the gate alone: " in launch.reason and "x1.025 with 41" in launch.reason


def test_behind_a_head_that_does_not_fit_the_pipeline_backfills_until_its_wait_is_over() -> None:
    cluster = nodes(4, n0=8000, n1=8000)
    sims = [running_on("a", "n0"), running_on("b", "n1")]  # warming up, on whole cores
    mems = {s.sim_id: SimMemory(stage="warmup") for s in sims}
    wide = queued(1, ranks=24)  # 24 cores: only 16 free
    queue = [wide, queued(2), queued(3), queued(4)]
    settings = replace(S, backfill_wait_s=60.0)
    d = decide(observe(100.0, *sims, queue=queue, nodes=cluster),
               ControllerState(sims=mems, last_launch_s=0.0), settings)  # fmt: skip
    assert [a.queue_id for a in launches(d)] == [2, 3]  # 16 cores: two of 8 pass the head
    assert all(a.reason.startswith("backfill: pipeline:") for a in launches(d))
    assert "queued simulation 1 waits for a, b to be profiled" in launches(d)[0].reason
    assert d.state.head_no_room == (1, 100.0)
    # once the head has waited backfill_wait_s nothing passes it
    aged = replace(d.state, launch_bucket=None, head_no_room=(1, 30.0))
    d = decide(observe(100.0, *sims, queue=queue, nodes=cluster), aged, settings)
    assert launches(d) == []


@settings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.integers(0, 8), min_size=2, max_size=12),
    sizes=st.lists(st.integers(1, 16), min_size=1, max_size=12),
    tokens=st.floats(0.0, 4.0),
    in_flight=st.integers(0, 10),
)
def test_the_pipeline_never_exceeds_the_room_the_rate_or_the_launches_in_flight(
    free: list[int], sizes: list[int], tokens: float, in_flight: int
) -> None:
    """Whatever the cluster and the queue: launches fit the open room node by node, are a
    prefix-respecting subset of the queue (FIFO, or backfill behind a head that does not
    fit), and stay within the rate's bucket and the launches in flight."""
    cluster = tuple(
        NodeCores(f"n{i}", CORES, ours_ranks=8 - f, ours_millis=(8 - f) * 1000)
        for i, f in enumerate(free)
    )
    sims = [running_on(f"r{i}", f"n{i}", ranks=8 - f) for i, f in enumerate(free) if f < 8]
    starting = [
        replace(running_on(f"p{i}", None, ranks=1), starting=True)  # type: ignore[arg-type]
        for i in range(in_flight)
    ]
    mems = {s.sim_id: SimMemory(stage="sized", duty=(0.5,) * len(s.ranks)) for s in sims}
    mems |= {s.sim_id: SimMemory(stage="sized", duty=(0.5,)) for s in starting}
    queue = [queued(i + 1, ranks=n) for i, n in enumerate(sizes)]
    obs = Observations(
        now_s=100.0,
        capacity_millis=len(free) * CORES,
        sims=(*sims, *starting),
        queue=tuple(queue),
        nodes=cluster,
    )
    state = ControllerState(sims=mems, last_launch_s=0.0, launch_bucket=(tokens, 100.0))
    d = decide(obs, state, S)
    launched = [a.queue_id for a in launches(d)]
    assert len(launched) <= int(tokens)
    assert len(launched) <= max(0, S.max_starting - in_flight)
    assert launched == sorted(launched)  # in the queue's order
    # the pipeline's launches fit the open cores (one core per rank here) left by the
    # starting ones (not placed: they hold room) and by the gate's own launch, if any
    piped = [a for a in launches(d) if "pipeline:" in a.reason]
    gated = [a for a in launches(d) if "pipeline:" not in a.reason]
    assert len(gated) <= 1
    taken = sum(len(a.request_millis) or sizes[a.queue_id - 1] for a in gated)
    assert sum(sizes[a.queue_id - 1] for a in piped) <= max(0, sum(free) - in_flight - taken)
    if launched and launched[0] != 1:  # backfill: the head was held
        assert d.state.launch_held is not None
