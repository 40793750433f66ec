"""The database file's identity and its schema: tables, the version, the migrations.

`Store` (`rankpack.store.database`) calls `open_database` once per connection. The file
identifies itself (SQLite ``application_id`` and ``user_version``): a database made by
another program is refused untouched, one written by an older rankpack is migrated in place,
one step per committed transaction (a migration stopped between steps resumes at the step
it reached).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rankpack.errors import UserError

APPLICATION_ID = 0x524B5043  # "RKPC"
SCHEMA_VERSION = 5

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
    shared_s REAL,
    failure TEXT
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


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction, taken at once (``BEGIN IMMEDIATE``): committed or rolled back."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def identify_and_migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse another program's file; bring an older rankpack file to `SCHEMA_VERSION`."""
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    tables.discard("sqlite_sequence")
    if app not in (0, APPLICATION_ID) or (
        app == 0 and tables and not (version == 1 and tables >= _RANKPACK_TABLES)
    ):
        raise UserError(
            f"{path} belongs to another program (application id {app:#x}, tables "
            f"{', '.join(sorted(tables)) or 'none'}); it was left untouched: use another --db"
        )
    if version > SCHEMA_VERSION:
        raise UserError(
            f"database {path} was written by a newer rankpack (schema {version}); "
            "upgrade rankpack or use another --db"
        )
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA foreign_keys=ON")
    for step in MIGRATIONS[version - 1 :] if version else ():
        step(conn)
    with transaction(conn) as c:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                c.execute(statement)
        c.execute(f"PRAGMA application_id={APPLICATION_ID}")
        c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def migrate_v1(conn: sqlite3.Connection) -> None:
    """Schema 1 -> 2: backend-neutral run columns (backend, placement) replace the
    cgroup-only one; ranks get pod/node/restarts; the queue gets leases."""
    with transaction(conn) as c:
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


def migrate_v2(conn: sqlite3.Connection) -> None:
    """Schema 2 -> 3: samples carry the shim's cumulative compute and MPI nanoseconds
    (duty cycles over time, for the report's heat-map); older samples have none."""
    with transaction(conn) as c:
        cols = {r[1] for r in c.execute("PRAGMA table_info(samples)")}
        for name in ("compute_ns", "mpi_ns"):
            if name not in cols:
                c.execute(f"ALTER TABLE samples ADD COLUMN {name} INTEGER")
        c.execute("PRAGMA user_version=3")  # its own step: a later one may still fail


def migrate_v3(conn: sqlite3.Connection) -> None:
    """Schema 3 -> 4: runs record how long they shared the node with another simulation
    of their controller (``shared_s``); older runs have none (unknown)."""
    with transaction(conn) as c:
        cols = {r[1] for r in c.execute("PRAGMA table_info(runs)")}
        if "shared_s" not in cols:
            c.execute("ALTER TABLE runs ADD COLUMN shared_s REAL")
        c.execute("PRAGMA user_version=4")


def migrate_v4(conn: sqlite3.Connection) -> None:
    """Schema 4 -> 5: a failed run records its failure code (``failure``,
    `rankpack.core.failures.FailureCode`) beside its message; older runs have none."""
    with transaction(conn) as c:
        cols = {r[1] for r in c.execute("PRAGMA table_info(runs)")}
        if "failure" not in cols:
            c.execute("ALTER TABLE runs ADD COLUMN failure TEXT")
        c.execute("PRAGMA user_version=5")


MIGRATIONS = (migrate_v1, migrate_v2, migrate_v3, migrate_v4)
"""``MIGRATIONS[v - 1]`` takes a schema-``v`` file to ``v + 1``, in its own transaction."""
