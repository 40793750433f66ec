"""The results database: one SQLite file (runs, per-rank results, samples, events, queue).

Written by the run driver and the controller; read by `rankpack runs` and the report layer.
WAL mode lets `rankpack runs list` read while a run is writing. A run whose owning process
has disappeared (killed with SIGKILL) is marked ``interrupted`` the next time it is read.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rankpack._proc import alive
from rankpack.errors import UserError
from rankpack.report.results import RankResult, RunResult

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL,
    finished_at TEXT,
    case_name TEXT NOT NULL,
    case_source TEXT NOT NULL,
    run_dir TEXT NOT NULL,
    solver TEXT NOT NULL,
    n_ranks INTEGER NOT NULL,
    qos TEXT NOT NULL,
    total_millis INTEGER NOT NULL,
    decompose TEXT NOT NULL DEFAULT 'equal',
    cgroups TEXT NOT NULL,
    status TEXT NOT NULL,
    exit_code INTEGER,
    iterations INTEGER NOT NULL DEFAULT 0,
    expected_iterations INTEGER,
    wall_s REAL,
    cpu_s REAL,
    message TEXT,
    owner_pid INTEGER,
    options_json TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS run_ranks (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    rank INTEGER NOT NULL,
    weight REAL NOT NULL,
    cpu_millis INTEGER NOT NULL,
    limit_millis INTEGER,
    cells INTEGER,
    cpu_s REAL,
    cpu_s_counter REAL,
    nr_throttled INTEGER,
    throttled_s REAL,
    duty REAL,
    PRIMARY KEY (run_id, rank)
);
CREATE TABLE IF NOT EXISTS samples (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    t_s REAL NOT NULL,
    rank INTEGER NOT NULL,
    usage_ns INTEGER NOT NULL,
    request_millis INTEGER NOT NULL,
    nr_throttled INTEGER NOT NULL,
    iterations INTEGER
);
CREATE INDEX IF NOT EXISTS samples_run ON samples(run_id, rank, t_s);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER,
    at TEXT NOT NULL,
    t_s REAL NOT NULL,
    kind TEXT NOT NULL,
    detail_json TEXT NOT NULL DEFAULT '{}',
    multiplex_id INTEGER
);
CREATE INDEX IF NOT EXISTS events_run ON events(run_id, id);
CREATE TABLE IF NOT EXISTS queue (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    submitted_at TEXT NOT NULL,
    case_name TEXT NOT NULL,
    n_ranks INTEGER NOT NULL,
    options_json TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    run_id INTEGER REFERENCES runs(id),
    multiplex_id INTEGER
);
CREATE TABLE IF NOT EXISTS multiplex (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    status TEXT NOT NULL DEFAULT 'running',
    owner_pid INTEGER,
    capacity_millis INTEGER NOT NULL,
    max_concurrent INTEGER NOT NULL,
    wait_mode TEXT,
    summary_json TEXT NOT NULL DEFAULT '{}'
);
"""

_RUN_COLUMNS = (
    "id", "created_at", "finished_at", "case_name", "case_source", "run_dir", "solver",
    "n_ranks", "qos", "total_millis", "decompose", "cgroups", "status", "exit_code",
    "iterations", "expected_iterations", "wall_s", "cpu_s", "message", "owner_pid",
    "options_json",
)  # fmt: skip


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise UserError(
                f"cannot open database {path}: {exc}; set --db or RANKPACK_DB"
            ) from None
        self.conn.row_factory = sqlite3.Row
        try:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise UserError(
                    f"database {path} was written by a newer rankpack (schema {version}); "
                    "upgrade rankpack or use another --db"
                )
            self.conn.executescript(_SCHEMA)
            self._add_missing_columns()
            self.conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            raise UserError(
                f"{path} is not a rankpack database ({exc}); use another --db"
            ) from None

    def _add_missing_columns(self) -> None:
        # Databases written before a column existed get it added (no data is rewritten).
        columns = {r[1] for r in self.conn.execute("PRAGMA table_info(events)")}
        if "multiplex_id" not in columns:
            self.conn.execute("ALTER TABLE events ADD COLUMN multiplex_id INTEGER")

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # -- runs ------------------------------------------------------------------------------

    def create_run(self, fields: dict[str, Any]) -> int:
        row = {"created_at": _now(), "status": "running", "owner_pid": os.getpid(), **fields}
        if isinstance(row.get("options_json"), dict):
            row["options_json"] = json.dumps(row["options_json"])
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        cur = self.conn.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})", list(row.values()))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def update_run(self, run_id: int, **fields: Any) -> None:
        self._update("runs", run_id, fields)

    def _update(self, table: str, row_id: int, fields: dict[str, Any]) -> None:
        if fields:
            sets = ", ".join(f"{k} = ?" for k in fields)
            self.conn.execute(f"UPDATE {table} SET {sets} WHERE id = ?", [*fields.values(), row_id])

    def set_plan(
        self, run_id: int, ranks: Iterable[tuple[int, float, int, int | None, int | None]]
    ) -> None:
        """(rank, weight, cpu_millis, limit_millis, cells) before the run starts."""
        with self.transaction() as c:
            c.executemany(
                "INSERT OR REPLACE INTO run_ranks (run_id, rank, weight, cpu_millis, limit_millis,"
                " cells) VALUES (?, ?, ?, ?, ?, ?)",
                [(run_id, *r) for r in ranks],
            )

    def finish_run(self, result: RunResult) -> None:
        with self.transaction() as c:
            c.execute(
                "UPDATE runs SET status=?, exit_code=?, iterations=?, wall_s=?, cpu_s=?, message=?,"
                " finished_at=? WHERE id=?",
                (
                    result.status,
                    result.exit_code,
                    result.iterations,
                    result.wall_s,
                    result.cpu_s,
                    result.message,
                    _now(),
                    result.id,
                ),
            )
            c.executemany(
                "INSERT OR REPLACE INTO run_ranks (run_id, rank, weight, cpu_millis, limit_millis,"
                " cells, cpu_s, cpu_s_counter, nr_throttled, throttled_s, duty)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        result.id,
                        r.rank,
                        r.weight,
                        r.cpu_millis,
                        r.limit_millis,
                        r.cells,
                        r.cpu_s,
                        r.cpu_s_counter,
                        r.nr_throttled,
                        r.throttled_s,
                        r.duty,
                    )
                    for r in result.ranks
                ],
            )

    def add_samples(
        self, run_id: int, rows: list[tuple[float, int, int, int, int, int | None]]
    ) -> None:
        """(t_s, rank, usage_ns, request_millis, nr_throttled, iterations) rows."""
        if rows:
            self.conn.executemany(
                "INSERT INTO samples (run_id, t_s, rank, usage_ns, request_millis, nr_throttled,"
                " iterations) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(run_id, *r) for r in rows],
            )

    def add_event(
        self,
        run_id: int | None,
        kind: str,
        detail: dict[str, Any],
        *,
        multiplex_id: int | None = None,
        t_s: float | None = None,
    ) -> None:
        """``t_s``: the controller's clock (seconds since its start); default wall time."""
        self.conn.execute(
            "INSERT INTO events (run_id, at, t_s, kind, detail_json, multiplex_id)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                run_id,
                _now(),
                time.time() if t_s is None else t_s,
                kind,
                json.dumps(detail, default=str),
                multiplex_id,
            ),
        )

    # -- queue and multiplex sessions --------------------------------------------------------

    def submit(self, case_name: str, n_ranks: int, options: dict[str, Any]) -> int:
        cur = self.conn.execute(
            "INSERT INTO queue (submitted_at, case_name, n_ranks, options_json)"
            " VALUES (?, ?, ?, ?)",
            (_now(), case_name, n_ranks, json.dumps(options)),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def queue(self, statuses: tuple[str, ...] = ("queued",)) -> list[dict[str, Any]]:
        marks = ", ".join("?" for _ in statuses)
        rows = self.conn.execute(
            f"SELECT * FROM queue WHERE status IN ({marks}) ORDER BY id", statuses
        ).fetchall()
        return [_decoded(r, "options_json", "options") for r in rows]

    def update_queue(self, queue_id: int, **fields: Any) -> None:
        self._update("queue", queue_id, fields)

    def start_multiplex(self, capacity_millis: int, max_concurrent: int, wait_mode: str) -> int:
        cur = self.conn.execute(
            "INSERT INTO multiplex (started_at, owner_pid, capacity_millis, max_concurrent,"
            " wait_mode) VALUES (?, ?, ?, ?, ?)",
            (_now(), os.getpid(), capacity_millis, max_concurrent, wait_mode),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def finish_multiplex(self, multiplex_id: int, status: str, summary: dict[str, Any]) -> None:
        self.conn.execute(
            "UPDATE multiplex SET finished_at = ?, status = ?, summary_json = ? WHERE id = ?",
            (_now(), status, json.dumps(summary, default=str), multiplex_id),
        )

    def multiplex_sessions(self) -> list[dict[str, Any]]:
        rows = self.conn.execute("SELECT * FROM multiplex ORDER BY id").fetchall()
        return [_decoded(r, "summary_json", "summary") for r in rows]

    def _repair_orphans(self) -> None:
        rows = self.conn.execute(
            "SELECT id, owner_pid FROM runs WHERE status = 'running'"
        ).fetchall()
        for row in rows:
            pid = row["owner_pid"]
            if pid is None or not alive(pid):
                self.update_run(
                    row["id"],
                    status="interrupted",
                    message="the rankpack process that ran it disappeared",
                )

    def list_runs(self, limit: int = 50) -> list[dict[str, Any]]:
        self._repair_orphans()
        rows = self.conn.execute(
            f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs ORDER BY id DESC LIMIT ?", (limit,)
        ).fetchall()
        return [_run_row(r) for r in rows]

    def get_run(self, run_id: int) -> dict[str, Any]:
        self._repair_orphans()
        row = self.conn.execute(
            f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
        if row is None:
            raise UserError(f"no run with id {run_id} in {self.path}; see `rankpack runs list`")
        data = _run_row(row)
        ranks = self.conn.execute(
            "SELECT rank, weight, cpu_millis, limit_millis, cells, cpu_s, cpu_s_counter,"
            " nr_throttled, throttled_s, duty FROM run_ranks WHERE run_id = ? ORDER BY rank",
            (run_id,),
        ).fetchall()
        data["ranks"] = [dict(r) for r in ranks]
        return data

    def samples(self, run_id: int) -> list[sqlite3.Row]:
        return self.conn.execute(
            "SELECT t_s, rank, usage_ns, request_millis, nr_throttled, iterations FROM samples"
            " WHERE run_id = ? ORDER BY t_s, rank",
            (run_id,),
        ).fetchall()

    def events(
        self, run_id: int | None = None, multiplex_id: int | None = None
    ) -> list[dict[str, Any]]:
        query, params = "SELECT * FROM events WHERE 1=1", []
        if run_id is not None:
            query += " AND run_id = ?"
            params.append(run_id)
        if multiplex_id is not None:
            query += " AND multiplex_id = ?"
            params.append(multiplex_id)
        rows = self.conn.execute(query + " ORDER BY id", params).fetchall()
        return [_decoded(r, "detail_json", "detail") for r in rows]


def _decoded(row: sqlite3.Row, column: str, key: str) -> dict[str, Any]:
    """The row as a dict with its JSON ``column`` decoded under ``key``."""
    data = dict(row)
    data[key] = json.loads(data.pop(column) or "{}")
    return data


def _run_row(row: sqlite3.Row) -> dict[str, Any]:
    return _decoded(row, "options_json", "options")


def rank_result_from_row(row: dict[str, Any]) -> RankResult:
    return RankResult(**{k: row.get(k) for k in RankResult.__dataclass_fields__})  # type: ignore[arg-type]
