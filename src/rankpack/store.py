"""The results database: one SQLite file (runs, per-rank results, samples, resizes, events,
the queue and multiplex sessions), with typed rows.

Written by the control loop; read by `rankpack runs`, `queue`, `events`, `model --from-db`
and the report. WAL mode lets readers work while a run writes. The file identifies itself
(SQLite ``application_id`` and ``user_version``): a database made by another program is
refused untouched, one written by an older rankpack is migrated in place. Read-only
commands open it with `Store.open_existing` and never create one.

Queue entries are claimed atomically with a lease (owner process and heartbeat): two
sessions never run one entry, and the entries of a session that died go back to the queue.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rankpack._proc import alive
from rankpack.core.results import RankResult, ResizeRecord, RunProgress, RunResult
from rankpack.errors import UserError

APPLICATION_ID = 0x524B5043  # "RKPC"
SCHEMA_VERSION = 4
LEASE_S = 30.0
"""A claimed queue entry whose heartbeat is older than this goes back to the queue."""

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
    backend TEXT NOT NULL DEFAULT 'local',
    placement_json TEXT NOT NULL DEFAULT '{}',
    status TEXT NOT NULL,
    exit_code INTEGER,
    iterations INTEGER NOT NULL DEFAULT 0,
    expected_iterations INTEGER,
    wall_s REAL,
    cpu_s REAL,
    message TEXT,
    owner_pid INTEGER,
    restarts INTEGER NOT NULL DEFAULT 0,
    options_json TEXT NOT NULL DEFAULT '{}',
    shared_s REAL
);
CREATE TABLE IF NOT EXISTS run_ranks (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
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
    pod TEXT,
    node TEXT,
    restarts INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, rank)
);
CREATE TABLE IF NOT EXISTS samples (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t_s REAL NOT NULL,
    rank INTEGER NOT NULL,
    usage_ns INTEGER NOT NULL,
    request_millis INTEGER NOT NULL,
    nr_throttled INTEGER NOT NULL,
    iterations INTEGER,
    compute_ns INTEGER,
    mpi_ns INTEGER
);
CREATE INDEX IF NOT EXISTS samples_run ON samples(run_id, rank, t_s);
CREATE TABLE IF NOT EXISTS resizes (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    rank INTEGER NOT NULL,
    t_s REAL NOT NULL,
    from_millis INTEGER NOT NULL,
    to_millis INTEGER NOT NULL,
    status TEXT NOT NULL,
    latency_s REAL,
    reason TEXT NOT NULL DEFAULT '',
    kind TEXT NOT NULL DEFAULT 'size'
);
CREATE INDEX IF NOT EXISTS resizes_run ON resizes(run_id, t_s);
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
    run_id INTEGER REFERENCES runs(id) ON DELETE SET NULL,
    multiplex_id INTEGER,
    owner_pid INTEGER,
    owner_host TEXT,
    heartbeat REAL
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
    backend TEXT NOT NULL DEFAULT 'local',
    summary_json TEXT NOT NULL DEFAULT '{}'
);
"""

_RANKPACK_TABLES = {"runs", "run_ranks", "samples", "events", "queue", "multiplex"}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- typed rows -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RankRow:
    rank: int
    weight: float
    cpu_millis: int
    limit_millis: int | None
    cells: int | None
    cpu_s: float | None = None
    cpu_s_counter: float | None = None
    nr_throttled: int | None = None
    throttled_s: float | None = None
    duty: float | None = None
    pod: str | None = None
    node: str | None = None
    restarts: int = 0


@dataclass(frozen=True)
class NewRun:
    """What is known of a run when it is launched."""

    case_name: str
    case_source: str
    run_dir: str
    solver: str
    n_ranks: int
    qos: str
    total_millis: int
    decompose: str
    backend: str
    placement: dict[str, Any]
    expected_iterations: int | None
    options: dict[str, Any]


@dataclass(frozen=True)
class RunRow(RunProgress):
    id: int
    created_at: str
    finished_at: str | None
    case_name: str
    case_source: str
    run_dir: str
    solver: str
    n_ranks: int
    qos: str
    total_millis: int
    decompose: str
    backend: str
    placement: dict[str, Any]
    status: str
    exit_code: int | None
    iterations: int
    expected_iterations: int | None
    wall_s: float | None
    cpu_s: float | None
    message: str | None
    owner_pid: int | None
    restarts: int
    options: dict[str, Any]
    ranks: tuple[RankRow, ...] = ()
    resizes: tuple[ResizeRecord, ...] = ()
    shared_s: float | None = None
    """Seconds it ran beside another simulation of its controller (0: alone throughout;
    None: not recorded, a run finished before schema 4 or adopted by a later controller)."""

    def to_json(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["ranks"] = [r.__dict__ for r in self.ranks]
        data["resizes"] = [r.to_json() for r in self.resizes]
        return data

    def result(self) -> RunResult:
        return RunResult(
            id=self.id,
            status=self.status,
            case=self.case_name,
            solver=self.solver,
            run_dir=self.run_dir,
            n_ranks=self.n_ranks,
            qos=self.qos,
            total_millis=self.total_millis,
            iterations=self.iterations,
            expected_iterations=self.expected_iterations,
            wall_s=self.wall_s or 0.0,
            cpu_s=self.cpu_s or 0.0,
            exit_code=self.exit_code,
            message=self.message,
            ranks=tuple(
                RankResult(
                    rank=r.rank,
                    weight=r.weight,
                    cpu_millis=r.cpu_millis,
                    limit_millis=r.limit_millis,
                    cpu_s=r.cpu_s or 0.0,
                    cpu_s_counter=r.cpu_s_counter or 0.0,
                    nr_throttled=r.nr_throttled or 0,
                    throttled_s=r.throttled_s or 0.0,
                    cells=r.cells,
                    duty=r.duty,
                    pod=r.pod,
                    node=r.node,
                    restarts=r.restarts,
                )
                for r in self.ranks
            ),
            decompose=self.decompose,
            backend=self.backend,
            placement=self.placement,
            resizes=self.resizes,
            restarts=self.restarts,
        )


@dataclass(frozen=True)
class SampleRow:
    t_s: float
    """Seconds since the run's launch."""
    rank: int
    usage_ns: int
    """The rank pod's cumulative CPU counter."""
    request_millis: int
    nr_throttled: int
    """Cumulative CFS throttled periods."""
    iterations: int | None
    compute_ns: int | None = None
    """The PMPI shim's cumulative time outside MPI (None without the shim)."""
    mpi_ns: int | None = None
    """The PMPI shim's cumulative time inside MPI (None without the shim)."""


@dataclass(frozen=True)
class EventRow:
    id: int
    run_id: int | None
    at: str
    t_s: float
    kind: str
    detail: dict[str, Any]
    multiplex_id: int | None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class QueueRow:
    id: int
    submitted_at: str
    case_name: str
    n_ranks: int
    options: dict[str, Any]
    status: str
    run_id: int | None
    multiplex_id: int | None
    owner_pid: int | None = None
    owner_host: str | None = None
    heartbeat: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class SessionRow:
    id: int
    started_at: str
    finished_at: str | None
    status: str
    owner_pid: int | None
    capacity_millis: int
    max_concurrent: int
    wait_mode: str | None
    backend: str
    summary: dict[str, Any] = field(default_factory=dict)


# -- the store ------------------------------------------------------------------------------


class Store:
    def __init__(self, path: Path, *, create: bool = True) -> None:
        self.path = path
        if not create and not path.exists():
            raise UserError(f"no rankpack database at {path}; nothing has been recorded there")
        try:
            if create:
                path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise UserError(
                f"cannot open database {path}: {exc}; set --db or RANKPACK_DB"
            ) from None
        self.conn.row_factory = sqlite3.Row
        try:
            self._identify_and_migrate()
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise UserError(
                f"{path} is not a usable rankpack database ({exc}); use another --db"
            ) from None
        except BaseException:
            self.conn.close()
            raise

    @classmethod
    def open_existing(cls, path: Path) -> Store | None:
        """The database if it exists (read-only commands never create one), else None."""
        return cls(path, create=False) if path.exists() else None

    def _identify_and_migrate(self) -> None:
        app = self.conn.execute("PRAGMA application_id").fetchone()[0]
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {
            r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        tables.discard("sqlite_sequence")
        if app not in (0, APPLICATION_ID) or (
            app == 0 and tables and not (version == 1 and tables >= _RANKPACK_TABLES)
        ):
            raise UserError(
                f"{self.path} belongs to another program (application id {app:#x}, tables "
                f"{', '.join(sorted(tables)) or 'none'}); it was left untouched: use another --db"
            )
        if version > SCHEMA_VERSION:
            raise UserError(
                f"database {self.path} was written by a newer rankpack (schema {version}); "
                "upgrade rankpack or use another --db"
            )
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        if version == 1:
            self._migrate_v1()
        if version in (1, 2):
            self._migrate_v2()
        if version in (1, 2, 3):
            self._migrate_v3()
        with self.transaction() as c:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    c.execute(statement)
            c.execute(f"PRAGMA application_id={APPLICATION_ID}")
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _migrate_v1(self) -> None:
        """Schema 1 -> 2: backend-neutral run columns (backend, placement) replace the
        cgroup-only one; ranks get pod/node/restarts; the queue gets leases."""
        with self.transaction() as c:
            cols = {r[1] for r in c.execute("PRAGMA table_info(runs)")}
            if "backend" not in cols:
                c.execute("ALTER TABLE runs ADD COLUMN backend TEXT NOT NULL DEFAULT 'local'")
                c.execute("ALTER TABLE runs ADD COLUMN placement_json TEXT NOT NULL DEFAULT '{}'")
                c.execute("ALTER TABLE runs ADD COLUMN restarts INTEGER NOT NULL DEFAULT 0")
            if "cgroups" in cols:
                c.execute("UPDATE runs SET placement_json = json_object('cgroups', cgroups)")
                c.execute("ALTER TABLE runs DROP COLUMN cgroups")
            rank_cols = {r[1] for r in c.execute("PRAGMA table_info(run_ranks)")}
            for name, decl in (("pod", "TEXT"), ("node", "TEXT"),
                               ("restarts", "INTEGER NOT NULL DEFAULT 0")):  # fmt: skip
                if name not in rank_cols:
                    c.execute(f"ALTER TABLE run_ranks ADD COLUMN {name} {decl}")
            event_cols = {r[1] for r in c.execute("PRAGMA table_info(events)")}
            if "multiplex_id" not in event_cols:
                c.execute("ALTER TABLE events ADD COLUMN multiplex_id INTEGER")
            queue_cols = {r[1] for r in c.execute("PRAGMA table_info(queue)")}
            for name, decl in (("owner_pid", "INTEGER"), ("owner_host", "TEXT"),
                               ("heartbeat", "REAL")):  # fmt: skip
                if name not in queue_cols:
                    c.execute(f"ALTER TABLE queue ADD COLUMN {name} {decl}")
            mux_cols = {r[1] for r in c.execute("PRAGMA table_info(multiplex)")}
            if "backend" not in mux_cols:
                c.execute("ALTER TABLE multiplex ADD COLUMN backend TEXT NOT NULL DEFAULT 'local'")
            c.execute("PRAGMA user_version=2")

    def _migrate_v2(self) -> None:
        """Schema 2 -> 3: samples carry the shim's cumulative compute and MPI nanoseconds
        (duty cycles over time, for the report's heat-map); older samples have none."""
        with self.transaction() as c:
            cols = {r[1] for r in c.execute("PRAGMA table_info(samples)")}
            for name in ("compute_ns", "mpi_ns"):
                if name not in cols:
                    c.execute(f"ALTER TABLE samples ADD COLUMN {name} INTEGER")
            c.execute("PRAGMA user_version=3")  # its own step: a later one may still fail

    def _migrate_v3(self) -> None:
        """Schema 3 -> 4: runs record how long they shared the node with another simulation
        of their controller (``shared_s``); older runs have none (unknown)."""
        with self.transaction() as c:
            cols = {r[1] for r in c.execute("PRAGMA table_info(runs)")}
            if "shared_s" not in cols:
                c.execute("ALTER TABLE runs ADD COLUMN shared_s REAL")
            c.execute("PRAGMA user_version=4")

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

    def create_run(self, run: NewRun, ranks: Sequence[RankRow]) -> int:
        with self.transaction() as c:
            cur = c.execute(
                "INSERT INTO runs (created_at, status, owner_pid, case_name, case_source,"
                " run_dir, solver, n_ranks, qos, total_millis, decompose, backend,"
                " placement_json, expected_iterations, options_json)"
                " VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    _now(), os.getpid(), run.case_name, run.case_source, run.run_dir,
                    run.solver, run.n_ranks, run.qos, run.total_millis, run.decompose,
                    run.backend, json.dumps(run.placement), run.expected_iterations,
                    json.dumps(run.options, default=str),
                ),
            )  # fmt: skip
            assert cur.lastrowid is not None
            run_id = cur.lastrowid
            c.executemany(
                "INSERT INTO run_ranks (run_id, rank, weight, cpu_millis, limit_millis, cells)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(run_id, r.rank, r.weight, r.cpu_millis, r.limit_millis, r.cells) for r in ranks],
            )
        return run_id

    def update_progress(self, run_id: int, iterations: int) -> None:
        self.conn.execute("UPDATE runs SET iterations = ? WHERE id = ?", (iterations, run_id))

    def finish_run(self, result: RunResult) -> None:
        with self.transaction() as c:
            c.execute(
                "UPDATE runs SET status=?, exit_code=?, iterations=?, wall_s=?, cpu_s=?, message=?,"
                " finished_at=?, restarts=?, placement_json=?, shared_s=? WHERE id=?",
                (
                    result.status, result.exit_code, result.iterations, result.wall_s,
                    result.cpu_s, result.message, _now(), result.restarts,
                    json.dumps(result.placement), result.shared_s, result.id,
                ),
            )  # fmt: skip
            c.executemany(
                "INSERT OR REPLACE INTO run_ranks (run_id, rank, weight, cpu_millis, limit_millis,"
                " cells, cpu_s, cpu_s_counter, nr_throttled, throttled_s, duty, pod, node,"
                " restarts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                        r.pod,
                        r.node,
                        r.restarts,
                    )
                    for r in result.ranks
                ],
            )

    def add_samples(self, run_id: int, rows: Iterable[SampleRow]) -> None:
        self.conn.executemany(
            "INSERT INTO samples (run_id, t_s, rank, usage_ns, request_millis, nr_throttled,"
            " iterations, compute_ns, mpi_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    run_id,
                    r.t_s,
                    r.rank,
                    r.usage_ns,
                    r.request_millis,
                    r.nr_throttled,
                    r.iterations,
                    r.compute_ns,
                    r.mpi_ns,
                )
                for r in rows
            ],
        )

    def add_resize(self, run_id: int, r: ResizeRecord) -> None:
        self.conn.execute(
            "INSERT INTO resizes (run_id, rank, t_s, from_millis, to_millis, status, latency_s,"
            " reason, kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, r.rank, r.t_s, r.from_millis, r.to_millis, r.status, r.latency_s,
             r.reason, r.kind),
        )  # fmt: skip

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

    def take_over_run(self, run_id: int) -> bool:
        """This process follows run ``run_id`` from now on (a controller adopting what an
        earlier one launched); False if there is no such run or it has finished."""
        with self.conn:
            cur = self.conn.execute(
                "UPDATE runs SET owner_pid = ?, status = 'running', message = NULL"
                " WHERE id = ? AND status IN ('running', 'interrupted')",
                (os.getpid(), run_id),
            )
        return cur.rowcount == 1

    def _repair_orphans(self) -> None:
        rows = self.conn.execute(
            "SELECT id, owner_pid FROM runs WHERE status = 'running'"
        ).fetchall()
        for row in rows:
            pid = row["owner_pid"]
            if pid is None or not alive(pid):
                self.conn.execute(
                    "UPDATE runs SET status = 'interrupted', message = ? WHERE id = ?",
                    ("the rankpack process that ran it disappeared", row["id"]),
                )

    def list_runs(self, limit: int = 50) -> list[RunRow]:
        self._repair_orphans()
        rows = self.conn.execute("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (limit,))
        return [_run_row(r) for r in rows.fetchall()]

    def all_runs(self) -> list[RunRow]:
        self._repair_orphans()
        return [_run_row(r) for r in self.conn.execute("SELECT * FROM runs ORDER BY id")]

    def get_run(self, run_id: int) -> RunRow:
        self._repair_orphans()
        row = self.conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise UserError(f"no run with id {run_id} in {self.path}; see `rankpack runs list`")
        ranks = self.conn.execute(
            "SELECT rank, weight, cpu_millis, limit_millis, cells, cpu_s, cpu_s_counter,"
            " nr_throttled, throttled_s, duty, pod, node, restarts FROM run_ranks"
            " WHERE run_id = ? ORDER BY rank",
            (run_id,),
        ).fetchall()
        resizes = self.conn.execute(
            "SELECT rank, t_s, from_millis, to_millis, status, latency_s, reason, kind"
            " FROM resizes WHERE run_id = ? ORDER BY rowid",
            (run_id,),
        ).fetchall()
        base = _run_row(row)
        return RunRow(
            **{k: getattr(base, k) for k in base.__dataclass_fields__
               if k not in ("ranks", "resizes")},
            ranks=tuple(RankRow(**dict(r)) for r in ranks),
            resizes=tuple(ResizeRecord(**dict(r)) for r in resizes),
        )  # fmt: skip

    def samples(self, run_id: int) -> list[SampleRow]:
        rows = self.conn.execute(
            "SELECT t_s, rank, usage_ns, request_millis, nr_throttled, iterations, compute_ns,"
            " mpi_ns FROM samples WHERE run_id = ? ORDER BY t_s, rank",
            (run_id,),
        )
        return [SampleRow(**dict(r)) for r in rows.fetchall()]

    def events(
        self, run_id: int | None = None, multiplex_id: int | None = None, after_id: int = 0
    ) -> list[EventRow]:
        """Events in the order recorded; ``after_id``: only those recorded after that one."""
        query, params = "SELECT * FROM events WHERE id > ?", [after_id]
        if run_id is not None:
            query += " AND run_id = ?"
            params.append(run_id)
        if multiplex_id is not None:
            query += " AND multiplex_id = ?"
            params.append(multiplex_id)
        rows = self.conn.execute(query + " ORDER BY id", params).fetchall()
        return [
            EventRow(
                id=r["id"],
                run_id=r["run_id"],
                at=r["at"],
                t_s=r["t_s"],
                kind=r["kind"],
                detail=json.loads(r["detail_json"] or "{}"),
                multiplex_id=r["multiplex_id"],
            )
            for r in rows
        ]

    # -- queue -----------------------------------------------------------------------------

    def submit_many(
        self, case_name: str, n_ranks: int, options: dict[str, Any], count: int
    ) -> list[int]:
        """Queue ``count`` copies in one transaction: all or none."""
        with self.transaction() as c:
            ids = []
            for _ in range(count):
                cur = c.execute(
                    "INSERT INTO queue (submitted_at, case_name, n_ranks, options_json)"
                    " VALUES (?, ?, ?, ?)",
                    (_now(), case_name, n_ranks, json.dumps(options)),
                )
                assert cur.lastrowid is not None
                ids.append(cur.lastrowid)
        return ids

    def submit(self, case_name: str, n_ranks: int, options: dict[str, Any]) -> int:
        return self.submit_many(case_name, n_ranks, options, 1)[0]

    def queue(self, statuses: tuple[str, ...] = ("queued",)) -> list[QueueRow]:
        marks = ", ".join("?" for _ in statuses)
        rows = self.conn.execute(
            f"SELECT * FROM queue WHERE status IN ({marks}) ORDER BY id", statuses
        ).fetchall()
        return [_queue_row(r) for r in rows]

    def claim(self, queue_id: int, multiplex_id: int | None) -> bool:
        """Take a queued entry for this process (atomic); False if someone else has it."""
        cur = self.conn.execute(
            "UPDATE queue SET status = 'running', owner_pid = ?, owner_host = ?, heartbeat = ?,"
            " multiplex_id = ? WHERE id = ? AND status = 'queued'",
            (os.getpid(), socket.gethostname(), time.time(), multiplex_id, queue_id),
        )
        return cur.rowcount == 1

    def heartbeat(self, queue_ids: Sequence[int]) -> None:
        if queue_ids:
            marks = ", ".join("?" for _ in queue_ids)
            self.conn.execute(
                f"UPDATE queue SET heartbeat = ? WHERE owner_pid = ? AND id IN ({marks})",
                (time.time(), os.getpid(), *queue_ids),
            )

    def set_queue_run(self, queue_id: int, run_id: int) -> None:
        self.conn.execute("UPDATE queue SET run_id = ? WHERE id = ?", (run_id, queue_id))

    def finish_queue(self, queue_id: int, status: str) -> None:
        self.conn.execute(
            "UPDATE queue SET status = ?, owner_pid = NULL, heartbeat = NULL WHERE id = ?",
            (status, queue_id),
        )

    def requeue_orphans(self, lease_s: float = LEASE_S) -> list[QueueRow]:
        """Entries claimed by a session that died go back to the queue (returned)."""
        host = socket.gethostname()
        back: list[QueueRow] = []
        with self.transaction() as c:
            for row in c.execute("SELECT * FROM queue WHERE status = 'running'").fetchall():
                q = _queue_row(row)
                local_dead = q.owner_host == host and (
                    q.owner_pid is None or not alive(q.owner_pid)
                )
                stale = q.heartbeat is None or time.time() - q.heartbeat > lease_s
                if (q.owner_host == host and local_dead) or (q.owner_host != host and stale):
                    c.execute(
                        "UPDATE queue SET status = 'queued', owner_pid = NULL, heartbeat = NULL,"
                        " run_id = NULL WHERE id = ?",
                        (q.id,),
                    )
                    back.append(q)
            for s in c.execute(
                "SELECT id, owner_pid FROM multiplex WHERE status = 'running'"
            ).fetchall():
                if s["owner_pid"] is None or not alive(s["owner_pid"]):
                    c.execute(
                        "UPDATE multiplex SET status = 'interrupted', finished_at = ? WHERE id = ?",
                        (_now(), s["id"]),
                    )
        return back

    def delete_runs(self, run_ids: Sequence[int]) -> None:
        """Forget runs: their rows, ranks, samples, resizes and events (one transaction).
        Queue entries that launched them keep their status and lose the link."""
        with self.transaction() as c:
            for rid in run_ids:
                for table in ("samples", "run_ranks", "resizes", "events"):
                    c.execute(f"DELETE FROM {table} WHERE run_id = ?", (rid,))
                c.execute("UPDATE queue SET run_id = NULL WHERE run_id = ?", (rid,))
                c.execute("DELETE FROM runs WHERE id = ?", (rid,))

    def set_queue_status(
        self, queue_ids: Sequence[int], status: str, only_from: tuple[str, ...]
    ) -> list[int]:
        """Move entries in one of ``only_from`` to ``status``; the ids that moved."""
        moved = []
        with self.transaction() as c:
            for qid in queue_ids:
                marks = ", ".join("?" for _ in only_from)
                cur = c.execute(
                    f"UPDATE queue SET status = ?, owner_pid = NULL, heartbeat = NULL"
                    f" WHERE id = ? AND status IN ({marks})",
                    (status, qid, *only_from),
                )
                if cur.rowcount:
                    moved.append(qid)
        return moved

    def get_queue(self, queue_id: int) -> QueueRow | None:
        row = self.conn.execute("SELECT * FROM queue WHERE id = ?", (queue_id,)).fetchone()
        return _queue_row(row) if row else None

    # -- multiplex sessions ------------------------------------------------------------------

    def start_multiplex(
        self, capacity_millis: int, max_concurrent: int, wait_mode: str, backend: str = "local"
    ) -> int:
        cur = self.conn.execute(
            "INSERT INTO multiplex (started_at, owner_pid, capacity_millis, max_concurrent,"
            " wait_mode, backend) VALUES (?, ?, ?, ?, ?, ?)",
            (_now(), os.getpid(), capacity_millis, max_concurrent, wait_mode, backend),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def finish_multiplex(self, multiplex_id: int, status: str, summary: dict[str, Any]) -> None:
        self.conn.execute(
            "UPDATE multiplex SET finished_at = ?, status = ?, summary_json = ? WHERE id = ?",
            (_now(), status, json.dumps(summary, default=str), multiplex_id),
        )

    def multiplex_sessions(self) -> list[SessionRow]:
        rows = self.conn.execute("SELECT * FROM multiplex ORDER BY id").fetchall()
        return [_session_row(r) for r in rows]

    def get_session(self, multiplex_id: int) -> SessionRow:
        row = self.conn.execute("SELECT * FROM multiplex WHERE id = ?", (multiplex_id,)).fetchone()
        if row is None:
            raise UserError(
                f"no multiplex session with id {multiplex_id} in {self.path}; see "
                "`rankpack events` for the sessions recorded there"
            )
        return _session_row(row)

    def session_run_ids(self, multiplex_id: int) -> list[int]:
        """The runs a multiplex session launched, in launch order."""
        rows = self.conn.execute(
            "SELECT id FROM runs WHERE json_extract(options_json, '$.multiplex_id') = ?"
            " ORDER BY id",
            (multiplex_id,),
        ).fetchall()
        return [int(r[0]) for r in rows]

    def set_run_message(self, run_id: int, message: str) -> None:
        """Replace a finished run's message (e.g. why a caller stopped it)."""
        self.conn.execute("UPDATE runs SET message = ? WHERE id = ?", (message, run_id))


def _session_row(r: sqlite3.Row) -> SessionRow:
    return SessionRow(
        id=r["id"],
        started_at=r["started_at"],
        finished_at=r["finished_at"],
        status=r["status"],
        owner_pid=r["owner_pid"],
        capacity_millis=r["capacity_millis"],
        max_concurrent=r["max_concurrent"],
        wait_mode=r["wait_mode"],
        backend=r["backend"],
        summary=json.loads(r["summary_json"] or "{}"),
    )


def _run_row(row: sqlite3.Row) -> RunRow:
    d = dict(row)
    return RunRow(
        id=d["id"], created_at=d["created_at"], finished_at=d["finished_at"],
        case_name=d["case_name"], case_source=d["case_source"], run_dir=d["run_dir"],
        solver=d["solver"], n_ranks=d["n_ranks"], qos=d["qos"], total_millis=d["total_millis"],
        decompose=d["decompose"], backend=d["backend"],
        placement=json.loads(d["placement_json"] or "{}"), status=d["status"],
        exit_code=d["exit_code"], iterations=d["iterations"],
        expected_iterations=d["expected_iterations"], wall_s=d["wall_s"], cpu_s=d["cpu_s"],
        message=d["message"], owner_pid=d["owner_pid"], restarts=d["restarts"],
        options=json.loads(d["options_json"] or "{}"), shared_s=d.get("shared_s"),
    )  # fmt: skip


def _queue_row(row: sqlite3.Row) -> QueueRow:
    d = dict(row)
    return QueueRow(
        id=d["id"], submitted_at=d["submitted_at"], case_name=d["case_name"],
        n_ranks=d["n_ranks"], options=json.loads(d["options_json"] or "{}"), status=d["status"],
        run_id=d["run_id"], multiplex_id=d["multiplex_id"], owner_pid=d.get("owner_pid"),
        owner_host=d.get("owner_host"), heartbeat=d.get("heartbeat"),
    )  # fmt: skip
