"""Tables a user reads at the end of a run and in `rankpack runs`."""

from __future__ import annotations

from rich.table import Table

from rankpack.core.results import RunResult
from rankpack.store import RunRow


def run_table(result: RunResult) -> Table:
    table = Table(
        title=(
            f"run {result.id}: {result.case} ({result.solver}), {result.status}"
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
    for col in ("rank", "weight", "cells", "request", "limit", "CPU-s", "counter",
                "thr.", "thr. s", "duty"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in result.ranks:
        table.add_row(
            str(r.rank),
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
