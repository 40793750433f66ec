"""`rankpack runs delete|prune`: forget runs, remove the run directories rankpack made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankpack.cli import main
from rankpack.store import NewRun, RankRow, SampleRow, Store


def _run_with_status(store: Store, run_dir: Path, status: str) -> int:
    run_dir.mkdir(parents=True)
    (run_dir / ".rankpack").mkdir()
    rid = store.create_run(
        NewRun("pitzDaily", "/src", str(run_dir), "simpleFoam", 1, "requests", 1000, "equal",
               "local", {}, 10, {}),
        [RankRow(0, 1.0, 1000, None, 100)],
    )  # fmt: skip
    store.add_samples(rid, [SampleRow(0.0, 0, 0, 1000, 0, 0)])
    store.add_event(rid, "launch", {})
    if status != "running":
        store.conn.execute("UPDATE runs SET status = ? WHERE id = ?", (status, rid))
    return rid


def test_delete_forgets_rows_and_removes_the_run_directory(
    tmp_path: Path, isolated_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(isolated_home / "rankpack.db")
    keep = _run_with_status(store, tmp_path / "a", "completed")
    gone = _run_with_status(store, tmp_path / "b", "failed")
    assert main(["runs", "delete", str(gone), "--yes", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["deleted"] == [gone] and out["removed_dirs"] == [str(tmp_path / "b")]
    assert not (tmp_path / "b").exists() and (tmp_path / "a").is_dir()
    assert [r.id for r in store.list_runs()] == [keep]
    assert store.samples(gone) == [] and store.events(run_id=gone) == []


def test_delete_refuses_a_running_run_and_asks_without_yes(
    tmp_path: Path, isolated_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(isolated_home / "rankpack.db")
    running = _run_with_status(store, tmp_path / "r", "running")
    done = _run_with_status(store, tmp_path / "d", "completed")
    assert main(["runs", "delete", str(running), "--yes"]) == 2
    assert "still running" in capsys.readouterr().err
    assert main(["runs", "delete", str(done)]) == 2  # no terminal to ask on: needs --yes
    assert "--yes" in capsys.readouterr().err
    assert {r.id for r in store.list_runs()} == {running, done}


def test_prune_takes_failed_and_interrupted_by_default(
    tmp_path: Path, isolated_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(isolated_home / "rankpack.db")
    ok = _run_with_status(store, tmp_path / "ok", "completed")
    _run_with_status(store, tmp_path / "f", "failed")
    _run_with_status(store, tmp_path / "i", "interrupted")
    (tmp_path / "i" / ".rankpack").rmdir()  # not recognisably rankpack's: kept
    assert main(["runs", "prune", "--yes", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["deleted"]) == 2 and out["kept_dirs"] == [str(tmp_path / "i")]
    assert [r.id for r in store.list_runs()] == [ok]
    assert main(["runs", "prune", "--days", "3", "--status", "all", "--yes"]) == 0
    assert [r.id for r in store.list_runs()] == [ok]  # created today: not old enough
