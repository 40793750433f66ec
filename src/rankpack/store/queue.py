"""The queue: simulations waiting for `rankpack multiplex`, claimed with a lease.

Queue entries are claimed atomically with a lease (owner process, host and heartbeat): two
sessions never run one entry, and the entries of a session that died go back to the queue.
Written by `rankpack submit`, `queue cancel|requeue` and the multiplexer's session.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from rankpack._proc import alive
from rankpack.store.connection import Connected, now
from rankpack.store.rows import QueueRow, queue_row

LEASE_S = 30.0
"""A claimed queue entry whose heartbeat is older than this goes back to the queue."""


class QueueTable(Connected):
    """The ``queue`` table (and, for dead sessions, their ``multiplex`` rows)."""

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
                    (now(), case_name, n_ranks, json.dumps(options)),
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
        return [queue_row(r) for r in rows]

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

    def release_claim(self, queue_id: int) -> None:
        """A claimed entry whose launch was refused (e.g. the namespace's quota had no
        room) goes back to the queue, as if never claimed (its run link dropped)."""
        self.conn.execute(
            "UPDATE queue SET status = 'queued', owner_pid = NULL, heartbeat = NULL,"
            " run_id = NULL WHERE id = ?",
            (queue_id,),
        )

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
                q = queue_row(row)
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
                        (now(), s["id"]),
                    )
        return back

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
        return queue_row(row) if row else None
