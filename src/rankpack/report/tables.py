"""Tables a user reads at the end of a run, in `rankpack runs` and from `rankpack profile`."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from rankpack.core.results import RunResult
from rankpack.profile.sampling import ProfileSummary
from rankpack.store import RunRow


def run_table(result: RunResult) -> Table:
    table = Table(
        title=(
            f"run {result.id}: {result.case} ({result.solver}), {result.status}"
            f"{f' ({result.failure})' if result.failure else ''}"
            f"{' (converged)' if result.converged else ''}, "
            f"{result.iterations} iterations in {result.wall_s:.1f} s, "
            f"{result.cpu_s:.1f} CPU-s, qos {result.qos}, backend {result.backend}"
            f"{_placement(result.placement)}, {len(result.resizes)} resizes,"
            f" {result.restarts} restarts"
        ),
        caption=(
            f"run directory: {result.run_dir}\nCPU-s: trapezoidal integral of ~1 Hz samples; "
            "counter: the rank pod's usage counter; thr.: CFS throttling events"
        ),
    )
    # Where each rank ran, on a cluster (the local backend's one node is the host itself)
    nodes = result.backend != "local" and any(r.node for r in result.ranks)
    for col in ("rank", *(("node",) if nodes else ()), "weight", "cells", "request", "limit",
                "CPU-s", "counter", "thr.", "thr. s", "duty"):  # fmt: skip
        table.add_column(col, justify="left" if col == "node" else "right")
    for r in result.ranks:
        table.add_row(
            str(r.rank),
            *((r.node or "-",) if nodes else ()),
            f"{r.weight:g}",
            str(r.cells) if r.cells is not None else "-",
            f"{r.cpu_millis}m",
            f"{r.limit_millis}m" if r.limit_millis is not None else "-",
            f"{r.cpu_s:.2f}",
            f"{r.cpu_s_counter:.2f}",
            str(r.nr_throttled),
            f"{r.throttled_s:.2f}",
            f"{r.duty:.0%}" if r.duty is not None else "-",
        )
    return table


def _placement(placement: dict[str, object]) -> str:
    shown = ", ".join(f"{k} {v}" for k, v in placement.items() if k != "node")
    return f" ({shown})" if shown else ""


def runs_list_table(runs: list[RunRow]) -> Table:
    table = Table(title="runs")
    for col in ("id", "created", "case", "ranks", "qos", "request", "decompose", "status",
                "iterations", "wall s", "CPU-s"):  # fmt: skip
        table.add_column(col, justify="right" if col not in ("case", "status") else "left")
    for r in runs:
        table.add_row(
            str(r.id),
            r.created_at.replace("T", " ")[:19],
            r.case_name,
            str(r.n_ranks),
            r.qos,
            f"{r.total_millis}m",
            r.decompose,
            r.status,
            str(r.iterations),
            f"{r.wall_s:.1f}" if r.wall_s is not None else "-",
            f"{r.cpu_s:.1f}" if r.cpu_s is not None else "-",
        )
    return table


def print_summary_table(
    summary: ProfileSummary, ranks: int, mpi: str, wait: str, exit_code: int | None, log: Path
) -> None:
    state = "still running, stopped" if exit_code is None else f"exit code {exit_code}"
    table = Table(title=f"Duty cycles ({ranks} ranks, {mpi}, wait {wait}; {state})")
    for col in ("rank", "duty", "compute_s", "mpi_s", "request", "reclaimable"):
        table.add_column(col, justify="right")
    for r in summary.ranks:
        duty = "-" if r.duty is None else f"{100 * r.duty:.1f}%"
        table.add_row(
            str(r.rank),
            duty,
            f"{r.compute_s:.3f}",
            f"{r.mpi_s:.3f}",
            f"{r.request_millis:.0f}m",
            f"{r.reclaimable_millis:.0f}m",
        )
    table.add_row(
        "total",
        "",
        "",
        "",
        f"{sum(r.request_millis for r in summary.ranks):.0f}m",
        f"{summary.reclaimable_millis_total:.0f}m",
        style="bold",
    )
    console = Console()
    console.print(table)
    console.print(f"output: {log}")
