from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from rankpack.errors import UserError
from rankpack.report.results import RankResult, RunResult, trapezoid_cpu_s
from rankpack.store import Store


def test_trapezoid_exact_for_constant_rate() -> None:
    times = [0.0, 1.0, 2.0, 3.0]
    usage = [0, 500_000_000, 1_000_000_000, 1_500_000_000]  # 0.5 cores
    assert trapezoid_cpu_s(times, usage) == pytest.approx(1.5)


def test_trapezoid_folds_the_final_reading_taken_right_after_exit() -> None:
    times = [0.0, 1.0, 2.0, 2.001]
    usage = [0, 1_000_000_000, 2_000_000_000, 2_000_000_000]
    assert trapezoid_cpu_s(times, usage) == pytest.approx(2.0)


def test_trapezoid_linear_ramp() -> None:
    # rate r(t) = t cores: usage = t^2/2
    times = [float(t) for t in range(11)]
    usage = [int(t * t / 2 * 1e9) for t in times]
    # midpoint rates are exact for a linear rate; edges are held flat (0.5 and 9.5)
    assert trapezoid_cpu_s(times, usage) == pytest.approx(50.0, rel=0.01)


def _result(run_id: int) -> RunResult:
    return RunResult(
        id=run_id, status="completed", case="pitzDaily", solver="simpleFoam", run_dir="/x",
        n_ranks=2, qos="requests", total_millis=2000, iterations=10, expected_iterations=10,
        wall_s=3.0, cpu_s=4.0, exit_code=0, cgroups="v1", message=None,
        ranks=(
            RankResult(0, 1.0, 500, None, 1.0, 1.01, 0, 0.0, cells=100),
            RankResult(1, 3.0, 1500, None, 3.0, 3.02, 0, 0.0, cells=300),
        ),
    )  # fmt: skip


def _new_run(store: Store) -> int:
    return store.create_run(
        {"case_name": "pitzDaily", "case_source": "/src", "run_dir": "/x", "solver": "simpleFoam",
         "n_ranks": 2, "qos": "requests", "total_millis": 2000, "cgroups": "v1"}
    )  # fmt: skip


def test_store_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path / "db" / "r.db")
    run_id = _new_run(store)
    store.set_plan(run_id, [(0, 1.0, 500, None, 100), (1, 3.0, 1500, None, 300)])
    store.add_samples(run_id, [(0.0, 0, 0, 500, 0, 0), (1.0, 0, 10**9, 500, 0, 3)])
    store.finish_run(_result(run_id))
    record = store.get_run(run_id)
    assert record["status"] == "completed" and record["iterations"] == 10
    assert [r["cpu_millis"] for r in record["ranks"]] == [500, 1500]
    assert record["ranks"][1]["cpu_s_counter"] == 3.02
    assert len(store.samples(run_id)) == 2
    assert [r["id"] for r in store.list_runs()] == [run_id]
    with pytest.raises(UserError, match="no run with id 999"):
        store.get_run(999)


def test_run_of_a_dead_owner_is_marked_interrupted(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    run_id = _new_run(store)
    store.update_run(run_id, owner_pid=2**22 + 777)  # never a live pid
    assert store.list_runs()[0]["status"] == "interrupted"
    mine = _new_run(store)
    assert store.get_run(mine)["status"] == "running"
    assert store.get_run(mine)["owner_pid"] == os.getpid()


def test_not_a_database(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_text("this is not sqlite" * 100)
    with pytest.raises(UserError, match="not a rankpack database"):
        Store(bad)


def test_newer_schema_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    with pytest.raises(UserError, match="newer rankpack"):
        Store(path)
