"""A multiplex session reports the physical limit of its gain (`model.limit`) beside the
measured gain, from the single runs' duty cycles and CPU use (simulated backend)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankpack.controller.baselines import measure_baselines
from rankpack.controller.decision import ControllerSettings
from rankpack.controller.session import run_session
from rankpack.controller.tracked import LoopSettings
from rankpack.plan.submission import Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

CASE = SimulatedCase("box", cells=8000, iterations=100, cell_work_s=1e-4)


def test_the_session_reports_the_work_conserving_limit(tmp_path: Path) -> None:
    cluster = SimulatedCluster(nodes=(SimNode("node-a", 2000),), cases=(CASE,))
    backend = SimulatedBackend(cluster)
    store = Store(tmp_path / "r.db")
    # cells 1:3 on two ranks of a core each: rank 0 computes a third of each iteration
    sub = Submission(case="box", weights=(1.0, 1.0), budget_millis=2000, sizing="fixed",
                     decompose="weighted", decompose_weights=(1.0, 3.0))  # fmt: skip
    store.submit_many("box", 2, sub.to_json(), 2)
    settings = LoopSettings(runs_root=tmp_path / "runs", wait_mode="auto",
                            controller=ControllerSettings(max_concurrent=2))  # fmt: skip
    measure_baselines(backend, store, settings, force=False)
    (single,) = store.all_runs()
    full = store.get_run(single.id)
    assert [round(r.duty or 0, 3) for r in full.ranks] == [0.333, 1.0]
    result = run_session(backend, store, settings, baseline="db")
    assert result.status == "completed" and result.sequential_s is not None
    # C1 = (1/3 + 1) cores x the CPU share of the wall time (1 s of start-up in 61 s)
    assert single.wall_s is not None
    cpu_rate = sum(r.cpu_s or 0 for r in full.ranks) / 2 / single.wall_s
    c1 = (1 / 3 + 1) * cpu_rate
    assert result.throughput_limit == pytest.approx(2.0 / c1, rel=1e-3)
    assert result.throughput_limit == pytest.approx(1.5, rel=0.03)
    data = result.to_json()
    assert data["throughput_limit"] == result.throughput_limit
    assert result.gate_limit == result.throughput_limit  # a core per rank: the gate agrees
    assert result.throughput_gain is not None
    assert result.throughput_gain <= result.throughput_limit + 1e-9


def test_no_single_runs_no_limit(tmp_path: Path) -> None:
    cluster = SimulatedCluster(nodes=(SimNode("node-a", 4000),), cases=(CASE,))
    store = Store(tmp_path / "r.db")
    sub = Submission(case="box", weights=(1.0, 1.0), budget_millis=1000, sizing="fixed")
    store.submit_many("box", 2, sub.to_json(), 1)
    settings = LoopSettings(runs_root=tmp_path / "runs",
                            controller=ControllerSettings(max_concurrent=1))  # fmt: skip
    result = run_session(SimulatedBackend(cluster), store, settings, baseline="db")
    assert result.throughput_limit is None and result.to_json()["throughput_limit"] is None


def test_the_gate_limit_counts_more_ranks_than_cores_as_filling_them(tmp_path: Path) -> None:
    """4 ranks on 2 cores: the session's bound counts the ranks' measured compute, the gate's
    counts all cores busy, so two such simulations have a gate limit of exactly 1."""
    cluster = SimulatedCluster(nodes=(SimNode("node-a", 2000),), cases=(CASE,))
    backend = SimulatedBackend(cluster)
    store = Store(tmp_path / "r.db")
    sub = Submission(case="box", weights=(1.0,) * 4, budget_millis=2000, sizing="fixed",
                     decompose="weighted", decompose_weights=(1.0, 1.0, 1.0, 5.0))  # fmt: skip
    store.submit_many("box", 2, sub.to_json(), 2)
    settings = LoopSettings(runs_root=tmp_path / "runs", wait_mode="auto",
                            controller=ControllerSettings(max_concurrent=2))  # fmt: skip
    measure_baselines(backend, store, settings, force=False)
    result = run_session(backend, store, settings, baseline="db")
    assert result.status == "completed"
    assert result.throughput_limit is not None and result.throughput_limit > 1.2
    assert result.gate_limit == pytest.approx(1.0)
    assert result.to_json()["gate_limit"] == result.gate_limit
