"""The simulated cluster at scale (issue 29): the apiserver's cost model (requests counted
by verb, launches and resizes delayed by its latency and rate), the nodes' load kept
incrementally (always what a count from scratch gives), lazy integration (the same run
however often it is observed), and the news a backend is told of. Virtual time."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankpack.backend.protocol import RankResources, ResizeState, SimPhase
from rankpack.testing.simapi import ApiModel
from rankpack.testing.simmodel import SimNode, SimTiming, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

from .test_simulated import INSTANT, cluster, run_to_end, start

CASE = SimulatedCase("box", cells=8000, iterations=20, cell_work_s=1e-4)


def test_the_bucket_spaces_requests_and_adds_the_latency() -> None:
    api = ApiModel(latency_s=0.005, rps=100.0)
    assert api.write(0.0, "create", 10) == pytest.approx(0.09 + 0.005)
    assert api.write(0.0, "patch") == pytest.approx(0.10 + 0.005)  # behind the creates
    assert api.write(5.0, "patch") == pytest.approx(5.005)  # the bucket emptied since
    api.read(5.0, "list")  # a watch cache answers reads
    assert api.counts() == {"create": 10, "patch": 2}


def test_a_launch_starts_after_its_creates_and_a_resize_after_its_patch() -> None:
    c = cluster(CASE, timing=SimTiming(stage_s=0.0, start_s=1.0, resize_latency_s=1.0))
    c.api = ApiModel(latency_s=0.0, rps=2.0)
    b = SimulatedBackend(c)
    start(b, "a", "box", (1000, 1000))  # 2 pods + ConfigMap + Service: 4 creates, 2 a second
    assert c.api.counts() == {"create": 4}
    c.advance(2.4)
    assert b.observe("a").phase is SimPhase.PENDING  # last create done at 1.5 s, +1 s start
    c.advance(0.2)
    assert b.observe("a").phase is SimPhase.RUNNING
    status = b.resize("a", 0, RankResources(500))  # patch at 2.6 s: the bucket is free
    assert status.state is ResizeState.PENDING
    c.advance(1.5)
    r = b.observe("a").ranks[0].resize
    assert r is not None and r.state is ResizeState.COMPLETED
    assert r.latency_s == pytest.approx(1.0)
    run_to_end(b, "a")
    b.release("a")
    assert c.api.counts() == {"create": 4, "patch": 1, "delete": 3}


def test_polling_reads_cost_requests_and_delay_the_writes_behind_them() -> None:
    c = cluster(CASE)
    c.api = ApiModel(latency_s=0.0, rps=10.0, reads="poll")
    b = SimulatedBackend(c)
    for _ in range(20):
        b.inventory()  # nodes and all pods: 2 lists each
    assert c.api.counts() == {"list": 40}
    # its creates wait for the lists before them: 40, and 2 observations while staging
    start(b, "a", "box", (1000,))
    c.advance(4.3)  # the last of its 3 creates starts at 4.4 s
    assert b.observe("a").phase is SimPhase.PENDING
    c.advance(0.2)
    assert b.observe("a").phase is SimPhase.RUNNING
    assert c.api.counts() == {"list": 44, "create": 3}


def test_a_run_is_the_same_however_often_it_is_observed() -> None:
    def run(observe_every: float) -> tuple[int, int, str]:
        b = SimulatedBackend(cluster(CASE, cores=2))
        start(b, "a", "box", (1000, 1000))
        start(b, "b", "box", (500, 500))
        log = ""
        while True:
            obs = b.observe("a")
            log += obs.log_text
            if obs.phase.ended:
                break
            b.wait(observe_every)
        return obs.ranks[0].usage_ns, obs.ranks[1].compute_ns or 0, log

    often, rarely = run(0.1), run(7.0)
    assert often[0] == pytest.approx(rarely[0], rel=1e-9)
    assert often[1] == pytest.approx(rarely[1], rel=1e-9)
    assert often[2] == rarely[2]


def test_a_backend_is_told_which_simulations_ended() -> None:
    b = SimulatedBackend(cluster(CASE))
    start(b, "a", "box", (1000,))
    start(b, "b", "box", (1000,), iterations=5)
    assert b.changed() == []
    run_to_end(b, "b")
    assert b.changed() == ["b"]
    assert b.changed() == []  # told once
    other = SimulatedBackend(b.cluster)  # another backend has not adopted it: not its news
    assert other.changed() == []


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["launch", "resize", "advance", "stop"]),
                  st.integers(0, 5), st.integers(1, 3000)),
        max_size=30,
    ),
)  # fmt: skip
def test_the_nodes_load_is_what_a_count_from_scratch_gives(ops: list[tuple[str, int, int]]) -> None:
    c = cluster(
        CASE, nodes=tuple(SimNode(f"n{i}", 4000, reserved_millis=100 * i) for i in range(3)),
        timing=SimTiming(stage_s=0.0, start_s=0.5, resize_latency_s=0.7),
    )  # fmt: skip
    b = SimulatedBackend(c)
    launched: list[str] = []
    for op, k, millis in ops:
        if op == "launch":
            sim_id = f"s{len(launched)}"
            start(b, sim_id, "box", tuple([min(millis, 4000)] * (1 + k % 3)))
            launched.append(sim_id)
        elif op == "resize" and launched:
            sim_id = launched[k % len(launched)]
            if not c.get(sim_id).phase.ended:
                b.resize(sim_id, 0, RankResources(min(millis, 4000)))
        elif op == "advance":
            c.advance(k * 0.3)
        elif op == "stop" and launched:
            b.stop(launched[k % len(launched)])
        inventory = c.inventory()
        for node in inventory.nodes:
            sims = [s for s in c._sims.values() if s.active]
            want = c._load.node(node.name).reserved_millis + sum(
                c._load.charge(r) for s in sims for r in s.ranks if r.node == node.name
            )
            assert node.requested_millis == want
            assert node.rank_pods == sum(1 for s in sims for r in s.ranks if r.node == node.name)


def test_instant_timing_still_runs_at_once() -> None:
    b = SimulatedBackend(cluster(CASE, timing=INSTANT))
    start(b, "a", "box", (1000, 1000))
    assert b.observe("a").phase is SimPhase.RUNNING
