"""`rankpack model fit --from-db` reads what `rankpack multiplex` recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankpack.cli import main
from rankpack.store import Store


def _finished_session(store: Store, n: int, makespan_s: float, t1_s: float) -> None:
    mid = store.start_multiplex(2000, n, "polite")
    sims = [{"status": "completed"} for _ in range(n)]
    store.finish_multiplex(
        mid,
        "completed",
        {"makespan_s": makespan_s, "sequential_s": n * t1_s, "simulations": sims},
    )


def test_points_from_recorded_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    store = Store(db)
    _finished_session(store, 2, 1410.0, 1249.0)
    _finished_session(store, 3, 1440.0, 1250.0)
    _finished_session(store, 3, 1452.0, 1248.0)  # median of the two N=3 sessions: 1446
    mid = store.start_multiplex(2000, 4, "polite")  # interrupted: not used
    store.finish_multiplex(mid, "interrupted", {"makespan_s": 5.0, "simulations": []})
    argv = ["--db", str(db), "model", "fit", "--ranks", "16", "--nodes", "12", "--cpus", "8",
            "--from-db", "--json"]  # fmt: skip
    assert main(argv) == 0
    points = {p["n"]: p["makespan_s"] for p in json.loads(capsys.readouterr().out)["points"]}
    assert points == {1: 1249.0, 2: 1410.0, 3: 1446.0}
