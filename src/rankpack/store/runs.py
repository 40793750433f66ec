"""Run rows: a run from its launch to its result, its ranks, samples and resizes.

Written by the control loop (`create_run`, `add_samples`, `add_resize`, `finish_run`),
read by `rankpack runs`, the report and the controller's learned sizes. A run whose owner
process died is shown as ``interrupted`` (repaired on read).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

from rankpack._proc import alive
from rankpack.core.results import ResizeRecord, RunResult
from rankpack.errors import UserError
from rankpack.store.connection import Connected, now
from rankpack.store.rows import NewRun, RankRow, RunRow, SampleRow, run_row


class RunTables(Connected):
    """The ``runs``, ``run_ranks``, ``samples`` and ``resizes`` tables."""

    def create_run(self, run: NewRun, ranks: Sequence[RankRow]) -> int:
        with self.transaction() as c:
            cur = c.execute(
                "INSERT INTO runs (created_at, status, owner_pid, case_name, case_source,"
                " run_dir, solver, n_ranks, qos, total_millis, decompose, backend,"
                " placement_json, expected_iterations, options_json)"
                " VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    now(), os.getpid(), run.case_name, run.case_source, run.run_dir,
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

    def requeue_run(self, run_id: int, message: str, failure: str) -> None:
        """A run whose launch was refused for a reason that passes (``failure``: the code,
        e.g. ``QuotaExceeded``): nothing ran; its job went back to the queue, and it is
        shown as ``requeued`` (never as failed, nor as running)."""
        self.conn.execute(
            "UPDATE runs SET status = 'requeued', message = ?, failure = ?, finished_at = ?,"
            " wall_s = 0, iterations = 0, owner_pid = NULL WHERE id = ?",
            (message, failure, now(), run_id),
        )

    def update_progress(self, run_id: int, iterations: int) -> None:
        self.conn.execute("UPDATE runs SET iterations = ? WHERE id = ?", (iterations, run_id))

    def finish_run(self, result: RunResult) -> None:
        with self.transaction() as c:
            c.execute(
                "UPDATE runs SET status=?, exit_code=?, iterations=?, wall_s=?, cpu_s=?, message=?,"
                " finished_at=?, restarts=?, placement_json=?, shared_s=?, failure=? WHERE id=?",
                (
                    result.status, result.exit_code, result.iterations, result.wall_s,
                    result.cpu_s, result.message, now(), result.restarts,
                    json.dumps(result.placement), result.shared_s, result.failure, result.id,
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
        return [run_row(r) for r in rows.fetchall()]

    def all_runs(self) -> list[RunRow]:
        self._repair_orphans()
        return [run_row(r) for r in self.conn.execute("SELECT * FROM runs ORDER BY id")]

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
        base = run_row(row)
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

    def delete_runs(self, run_ids: Sequence[int]) -> None:
        """Forget runs: their rows, ranks, samples, resizes and events (one transaction).
        Queue entries that launched them keep their status and lose the link."""
        with self.transaction() as c:
            for rid in run_ids:
                for table in ("samples", "run_ranks", "resizes", "events"):
                    c.execute(f"DELETE FROM {table} WHERE run_id = ?", (rid,))
                c.execute("UPDATE queue SET run_id = NULL WHERE run_id = ?", (rid,))
                c.execute("DELETE FROM runs WHERE id = ?", (rid,))

    def set_run_message(self, run_id: int, message: str) -> None:
        """Replace a finished run's message (e.g. why a caller stopped it)."""
        self.conn.execute("UPDATE runs SET message = ? WHERE id = ?", (message, run_id))
