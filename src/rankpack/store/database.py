"""`Store`: the results database opened, identified and migrated, with every table group.

A `Store` is one connection to one SQLite file (WAL mode: readers work while a run writes).
Its methods come from the table groups: run rows (`rankpack.store.runs`), the queue
(`rankpack.store.queue`), multiplex sessions and events (`rankpack.store.sessions`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from rankpack.errors import UserError
from rankpack.store.queue import QueueTable
from rankpack.store.runs import RunTables
from rankpack.store.schema import identify_and_migrate
from rankpack.store.sessions import SessionTables


class Store(RunTables, QueueTable, SessionTables):
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
            identify_and_migrate(self.conn, path)
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
