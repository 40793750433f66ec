"""The store's typed rows: what a read returns and what a write takes.

`RunRow` (a run, with its ranks and resizes), `SampleRow`, `EventRow`, `QueueRow`,
`SessionRow`, `NewRun` and `RankRow`; and the converters from SQLite rows. Read by
`rankpack runs`, `queue`, `events`, the report and the controller (learned sizes, sessions).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from rankpack.core.results import RankResult, ResizeRecord, RunProgress, RunResult


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
    failure: str | None = None
    """A failed run's code (`rankpack.core.failures.FailureCode`); None otherwise, and for
    runs recorded before schema 5."""

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
            failure=self.failure,
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


def session_row(r: sqlite3.Row) -> SessionRow:
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


def run_row(row: sqlite3.Row) -> RunRow:
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
        failure=d.get("failure"),
    )  # fmt: skip


def queue_row(row: sqlite3.Row) -> QueueRow:
    d = dict(row)
    return QueueRow(
        id=d["id"], submitted_at=d["submitted_at"], case_name=d["case_name"],
        n_ranks=d["n_ranks"], options=json.loads(d["options_json"] or "{}"), status=d["status"],
        run_id=d["run_id"], multiplex_id=d["multiplex_id"], owner_pid=d.get("owner_pid"),
        owner_host=d.get("owner_host"), heartbeat=d.get("heartbeat"),
    )  # fmt: skip
