"""Multiplex sessions and the event log.

A session row per `rankpack multiplex` (its capacity, wait mode, summary); events are the
controller's log of what it decided and saw (launches, resizes, wait modes, holds), read by
`rankpack events`, the report and the operator (Kubernetes Events).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from rankpack.errors import UserError
from rankpack.store.connection import Connected, now
from rankpack.store.rows import EventRow, SessionRow, session_row


class SessionTables(Connected):
    """The ``multiplex`` and ``events`` tables."""

    def start_multiplex(
        self, capacity_millis: int, max_concurrent: int, wait_mode: str, backend: str = "local"
    ) -> int:
        cur = self.conn.execute(
            "INSERT INTO multiplex (started_at, owner_pid, capacity_millis, max_concurrent,"
            " wait_mode, backend) VALUES (?, ?, ?, ?, ?, ?)",
            (now(), os.getpid(), capacity_millis, max_concurrent, wait_mode, backend),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def finish_multiplex(self, multiplex_id: int, status: str, summary: dict[str, Any]) -> None:
        self.conn.execute(
            "UPDATE multiplex SET finished_at = ?, status = ?, summary_json = ? WHERE id = ?",
            (now(), status, json.dumps(summary, default=str), multiplex_id),
        )

    def multiplex_sessions(self) -> list[SessionRow]:
        rows = self.conn.execute("SELECT * FROM multiplex ORDER BY id").fetchall()
        return [session_row(r) for r in rows]

    def get_session(self, multiplex_id: int) -> SessionRow:
        row = self.conn.execute("SELECT * FROM multiplex WHERE id = ?", (multiplex_id,)).fetchone()
        if row is None:
            raise UserError(
                f"no multiplex session with id {multiplex_id} in {self.path}; see "
                "`rankpack events` for the sessions recorded there"
            )
        return session_row(row)

    def session_run_ids(self, multiplex_id: int) -> list[int]:
        """The runs a multiplex session launched, in launch order."""
        rows = self.conn.execute(
            "SELECT id FROM runs WHERE json_extract(options_json, '$.multiplex_id') = ?"
            " ORDER BY id",
            (multiplex_id,),
        ).fetchall()
        return [int(r[0]) for r in rows]

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
                now(),
                time.time() if t_s is None else t_s,
                kind,
                json.dumps(detail, default=str),
                multiplex_id,
            ),
        )

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
