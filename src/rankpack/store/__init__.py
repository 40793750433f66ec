"""The results database: one SQLite file (runs, per-rank results, samples, resizes, events,
the queue and multiplex sessions), with typed rows.

Written by the control loop; read by ``rankpack runs``, ``queue``, ``events``,
``model --from-db`` and the report. Read-only commands open it with `Store.open_existing`
and never create one.

Modules: `schema` (the file's identity, tables and migrations), `connection` (the open
SQLite connection every group of tables works through), `rows` (typed rows), `runs` (run
rows, ranks, samples, resizes), `queue` (the queue and its leases), `sessions` (multiplex
sessions and the event log), `database` (`Store`, which combines them).
"""

from rankpack.store.database import Store
from rankpack.store.queue import LEASE_S
from rankpack.store.rows import (
    EventRow,
    NewRun,
    QueueRow,
    RankRow,
    RunRow,
    SampleRow,
    SessionRow,
)
from rankpack.store.schema import APPLICATION_ID, SCHEMA_VERSION

__all__ = [
    "APPLICATION_ID",
    "LEASE_S",
    "SCHEMA_VERSION",
    "EventRow",
    "NewRun",
    "QueueRow",
    "RankRow",
    "RunRow",
    "SampleRow",
    "SessionRow",
    "Store",
]
