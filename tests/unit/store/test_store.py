from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from rankpack.cli import main
from rankpack.core.accounting import trapezoid_cpu_s
from rankpack.core.failures import FailureCode
from rankpack.core.results import RankResult, ResizeRecord, RunResult
from rankpack.errors import UserError
from rankpack.store import APPLICATION_ID, SCHEMA_VERSION, NewRun, RankRow, SampleRow, Store, schema


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


def _stored_result(run_id: int, shared_s: float | None = None) -> RunResult:
    return RunResult(
        id=run_id, status="completed", case="pitzDaily", solver="simpleFoam", run_dir="/x",
        n_ranks=2, qos="requests", total_millis=2000, iterations=10, expected_iterations=10,
        wall_s=3.0, cpu_s=4.0, exit_code=0, message=None,
        ranks=(
            RankResult(0, 1.0, 500, None, 1.0, 1.01, 0, 0.0, cells=100, pod="p0", node="n"),
            RankResult(1, 3.0, 1500, None, 3.0, 3.02, 0, 0.0, cells=300, pod="p1", node="n"),
        ),
        backend="simulated", placement={"node": "n"}, restarts=0, shared_s=shared_s,
    )  # fmt: skip


def _new_run(store: Store) -> int:
    return store.create_run(
        NewRun(
            case_name="pitzDaily", case_source="/src", run_dir="/x", solver="simpleFoam",
            n_ranks=2, qos="requests", total_millis=2000, decompose="equal",
            backend="simulated", placement={"node": "n"}, expected_iterations=10,
            options={"iterations": 10},
        ),
        [RankRow(0, 1.0, 500, None, 100), RankRow(1, 3.0, 1500, None, 300)],
    )  # fmt: skip


def test_store_round_trip_typed_rows(tmp_path: Path) -> None:
    store = Store(tmp_path / "db" / "r.db")
    run_id = _new_run(store)
    store.add_samples(
        run_id, [SampleRow(0.0, 0, 0, 500, 0, 0), SampleRow(1.0, 0, 10**9, 500, 0, 3)]
    )
    store.add_resize(run_id, ResizeRecord(1, 2.5, 1500, 1000, "completed", 0.2, "phase", "phase"))
    store.finish_run(_stored_result(run_id))
    record = store.get_run(run_id)
    assert record.status == "completed" and record.iterations == 10
    assert record.backend == "simulated" and record.placement == {"node": "n"}
    assert [r.cpu_millis for r in record.ranks] == [500, 1500]
    assert record.ranks[1].cpu_s_counter == 3.02 and record.ranks[1].pod == "p1"
    assert [(r.rank, r.to_millis, r.status) for r in record.resizes] == [(1, 1000, "completed")]
    assert record.result().resizes == record.resizes
    assert [s.usage_ns for s in store.samples(run_id)] == [0, 10**9]
    assert [r.id for r in store.list_runs()] == [run_id]
    with pytest.raises(UserError, match="no run with id 999"):
        store.get_run(999)


def test_run_of_a_dead_owner_is_marked_interrupted(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    run_id = _new_run(store)
    store.conn.execute("UPDATE runs SET owner_pid = ? WHERE id = ?", (2**22 + 777, run_id))
    assert store.list_runs()[0].status == "interrupted"
    mine = _new_run(store)
    assert store.get_run(mine).status == "running"
    assert store.get_run(mine).owner_pid == os.getpid()


def test_not_a_database(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_text("this is not sqlite" * 100)
    with pytest.raises(UserError, match="not a usable rankpack database"):
        Store(bad)


def test_newer_schema_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    with pytest.raises(UserError, match="newer rankpack"):
        Store(path)


def test_a_database_of_another_program_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    conn.execute("INSERT INTO customers VALUES (1, 'x')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(UserError, match="belongs to another program"):
        Store(path)
    assert path.read_bytes() == before
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA application_id={APPLICATION_ID + 1}")
    conn.close()
    with pytest.raises(UserError, match="belongs to another program"):
        Store(path)


def test_read_only_open_never_creates(tmp_path: Path) -> None:
    path = tmp_path / "none" / "r.db"
    assert Store.open_existing(path) is None
    with pytest.raises(UserError, match="no rankpack database"):
        Store(path, create=False)
    assert not path.parent.exists()


def test_identifies_itself(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


V1_SCHEMA = """
CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, created_at TEXT NOT NULL,
    finished_at TEXT, case_name TEXT NOT NULL, case_source TEXT NOT NULL, run_dir TEXT NOT NULL,
    solver TEXT NOT NULL, n_ranks INTEGER NOT NULL, qos TEXT NOT NULL,
    total_millis INTEGER NOT NULL, decompose TEXT NOT NULL DEFAULT 'equal',
    cgroups TEXT NOT NULL, status TEXT NOT NULL, exit_code INTEGER,
    iterations INTEGER NOT NULL DEFAULT 0, expected_iterations INTEGER, wall_s REAL,
    cpu_s REAL, message TEXT, owner_pid INTEGER, options_json TEXT NOT NULL DEFAULT '{}');
CREATE TABLE run_ranks (run_id INTEGER NOT NULL REFERENCES runs(id), rank INTEGER NOT NULL,
    weight REAL NOT NULL, cpu_millis INTEGER NOT NULL, limit_millis INTEGER, cells INTEGER,
    cpu_s REAL, cpu_s_counter REAL, nr_throttled INTEGER, throttled_s REAL, duty REAL,
    PRIMARY KEY (run_id, rank));
CREATE TABLE samples (run_id INTEGER NOT NULL REFERENCES runs(id), t_s REAL NOT NULL,
    rank INTEGER NOT NULL, usage_ns INTEGER NOT NULL, request_millis INTEGER NOT NULL,
    nr_throttled INTEGER NOT NULL, iterations INTEGER);
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER, at TEXT NOT NULL,
    t_s REAL NOT NULL, kind TEXT NOT NULL, detail_json TEXT NOT NULL DEFAULT '{}',
    multiplex_id INTEGER);
CREATE TABLE queue (id INTEGER PRIMARY KEY AUTOINCREMENT, submitted_at TEXT NOT NULL,
    case_name TEXT NOT NULL, n_ranks INTEGER NOT NULL, options_json TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued', run_id INTEGER REFERENCES runs(id),
    multiplex_id INTEGER);
CREATE TABLE multiplex (id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT NOT NULL,
    finished_at TEXT, status TEXT NOT NULL DEFAULT 'running', owner_pid INTEGER,
    capacity_millis INTEGER NOT NULL, max_concurrent INTEGER NOT NULL, wait_mode TEXT,
    summary_json TEXT NOT NULL DEFAULT '{}');
INSERT INTO runs (created_at, case_name, case_source, run_dir, solver, n_ranks, qos,
    total_millis, cgroups, status, iterations, wall_s, options_json)
    VALUES ('2026-01-01T00:00:00', 'pitzDaily', '/src', '/runs/1', 'simpleFoam', 2,
    'requests', 2000, 'v1', 'completed', 30, 4.5, '{"iterations": 30}');
INSERT INTO run_ranks (run_id, rank, weight, cpu_millis, cells) VALUES (1, 0, 1.0, 1000, 6000);
INSERT INTO queue (submitted_at, case_name, n_ranks, options_json)
    VALUES ('2026-01-01T00:00:00', 'pitzDaily', 2, '{}');
PRAGMA user_version=1;
"""


def test_schema_1_file_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    conn.executescript(V1_SCHEMA)
    conn.close()
    store = Store(path)
    old = store.get_run(1)
    assert old.status == "completed" and old.iterations == 30 and old.wall_s == 4.5
    assert old.backend == "local" and old.placement == {"cgroups": "v1"}
    assert old.ranks[0].cells == 6000 and old.ranks[0].restarts == 0
    assert [q.status for q in store.queue()] == ["queued"]
    new = _new_run(store)  # the dropped cgroup-only column no longer blocks inserts
    assert store.get_run(new).backend == "simulated"
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    columns = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
    assert "cgroups" not in columns and {"backend", "placement_json"} <= columns


def test_queue_claims_are_exclusive_and_dead_sessions_requeue(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    a, b = Store(path), Store(path)
    (qid,) = a.submit_many("pitzDaily", 2, {"case": "pitzDaily"}, 1)
    assert a.claim(qid, None) is True
    assert b.claim(qid, None) is False  # a second session never takes a claimed entry
    assert a.requeue_orphans() == []  # its owner (this process) is alive
    a.conn.execute("UPDATE queue SET owner_pid = ? WHERE id = ?", (2**22 + 777, qid))
    back = b.requeue_orphans()
    assert [q.id for q in back] == [qid]
    assert [q.id for q in b.queue()] == [qid]
    assert b.claim(qid, None) is True


def test_submit_many_is_all_or_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "q.db")
    ids = store.submit_many("pitzDaily", 2, {"case": "pitzDaily"}, 5)
    assert ids == [1, 2, 3, 4, 5] and len(store.queue()) == 5
    with pytest.raises(TypeError):
        store.submit_many("pitzDaily", 2, {"bad": object()}, 3)
    assert len(store.queue()) == 5


def test_cancel_and_requeue_only_from_allowed_states(tmp_path: Path) -> None:
    store = Store(tmp_path / "q.db")
    q1, q2 = store.submit_many("pitzDaily", 2, {"case": "pitzDaily"}, 2)
    assert store.set_queue_status([q1], "cancelled", ("queued",)) == [q1]
    assert store.set_queue_status([q1], "cancelled", ("queued",)) == []
    assert store.set_queue_status([q1, q2], "queued", ("failed", "cancelled")) == [q1]


def test_schema_2_file_gains_the_shim_counters_of_samples(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    store = Store(path)
    run_id = _new_run(store)
    store.add_samples(run_id, [SampleRow(1.0, 0, 10**9, 500, 0, 3)])
    store.close()
    # a schema-2 file: samples without compute_ns / mpi_ns
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE samples2 AS SELECT run_id, t_s, rank, usage_ns, request_millis,"
        " nr_throttled, iterations FROM samples; DROP TABLE samples;"
        " ALTER TABLE samples2 RENAME TO samples; PRAGMA user_version=2;"
    )
    conn.close()
    store = Store(path)
    old = store.samples(run_id)
    assert [(s.usage_ns, s.compute_ns, s.mpi_ns) for s in old] == [(10**9, None, None)]
    store.add_samples(run_id, [SampleRow(2.0, 0, 2 * 10**9, 500, 1, 6, 700, 300)])
    assert [(s.compute_ns, s.mpi_ns) for s in store.samples(run_id)] == [(None, None), (700, 300)]
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5


def test_schema_3_file_gains_the_shared_seconds_of_runs(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    store = Store(path)
    old_id = _new_run(store)
    store.close()
    conn = sqlite3.connect(path)  # a schema-3 file: runs without shared_s
    conn.executescript("ALTER TABLE runs DROP COLUMN shared_s; PRAGMA user_version=3;")
    conn.close()
    store = Store(path)
    assert store.get_run(old_id).shared_s is None  # not recorded: unknown
    new_id = _new_run(store)
    store.finish_run(_stored_result(new_id, shared_s=2.5))
    assert store.get_run(new_id).shared_s == 2.5
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_failed_run_keeps_its_failure_code_and_schema_4_files_gain_the_column(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v4.db"
    store = Store(path)
    old_id = _new_run(store)
    store.close()
    conn = sqlite3.connect(path)  # a schema-4 file: runs without failure
    conn.executescript("ALTER TABLE runs DROP COLUMN failure; PRAGMA user_version=4;")
    conn.close()
    store = Store(path)
    assert store.get_run(old_id).failure is None  # recorded before codes: none
    new_id = _new_run(store)
    failed = replace(
        _stored_result(new_id), status="failed", message="rank 1 exited with code 3",
        failure=FailureCode.RANK_FAILED.value,
    )  # fmt: skip
    store.finish_run(failed)
    row = store.get_run(new_id)
    assert row.failure == "RankFailed" and row.to_json()["failure"] == "RankFailed"
    assert row.result().failure == "RankFailed"
    assert store.list_runs()[0].failure == "RankFailed"
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_migration_stopped_between_steps_resumes_at_the_step_it_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "v2.db"
    Store(path).close()
    conn = sqlite3.connect(path)  # a schema-2 file: no shim counters, no shared_s
    conn.executescript(
        "ALTER TABLE samples DROP COLUMN compute_ns; ALTER TABLE samples DROP COLUMN mpi_ns;"
        " ALTER TABLE runs DROP COLUMN shared_s; PRAGMA user_version=2;"
    )
    conn.close()

    def killed(conn: sqlite3.Connection) -> None:
        raise KeyboardInterrupt  # the process stops after step 2 -> 3 was committed

    steps = list(schema.MIGRATIONS)
    steps[2] = killed  # step 3 -> 4
    monkeypatch.setattr(schema, "MIGRATIONS", tuple(steps))
    with pytest.raises(KeyboardInterrupt):
        Store(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3  # not 4: step 3 -> 4 is owed
    conn.close()
    monkeypatch.undo()
    store = Store(path)
    run_id = _new_run(store)
    store.finish_run(_stored_result(run_id, shared_s=1.5))
    assert store.get_run(run_id).shared_s == 1.5


def test_sessions_by_id_and_their_runs(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    mid = store.start_multiplex(2000, 4, "auto")
    other = _new_run(store)
    mine = store.create_run(
        NewRun(
            case_name="pitzDaily", case_source="/src", run_dir="/y", solver="simpleFoam",
            n_ranks=2, qos="requests", total_millis=2000, decompose="equal",
            backend="local", placement={}, expected_iterations=10,
            options={"iterations": 10, "multiplex_id": mid},
        ),
        [RankRow(0, 1.0, 500, None, 100), RankRow(1, 3.0, 1500, None, 300)],
    )  # fmt: skip
    assert store.session_run_ids(mid) == [mine] and other != mine
    assert store.get_session(mid).capacity_millis == 2000
    with pytest.raises(UserError, match="no multiplex session with id 7"):
        store.get_session(7)
    store.set_run_message(other, "stopped at its time bound")
    assert store.get_run(other).message == "stopped at its time bound"


def test_runs_show_and_list_give_a_failed_runs_code(
    isolated_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(isolated_home / "rankpack.db")
    run_id = _new_run(store)
    store.finish_run(
        replace(_stored_result(run_id), status="failed", message="rank 1: OOM", failure="OOMKilled")
    )
    store.close()
    assert main(["runs", "show", str(run_id), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["failure"] == "OOMKilled"
    assert main(["runs", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["failure"] == "OOMKilled"
    assert main(["runs", "show", str(run_id)]) == 0
    assert "failed (OOMKilled)" in " ".join(capsys.readouterr().out.split())
