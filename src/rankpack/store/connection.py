"""What every group of tables works through: one open SQLite connection and its file.

`Connected` is the base of the table groups (`runs`, `queue`, `sessions`, `events`) that
`Store` (`rankpack.store.database`) combines; it holds no state of its own beyond these.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path

from rankpack.store import schema


def now() -> str:
    """Wall time as the store writes it (ISO 8601, UTC, whole seconds)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


class Connected:
    path: Path
    conn: sqlite3.Connection

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``): committed, or rolled back on error."""
        return schema.transaction(self.conn)

    def close(self) -> None:
        self.conn.close()
