"""The live display of a running simulation (rich, on stderr so --json stays clean)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

from rankpack.controller.views import SimView


def stop_live(live: Live) -> None:
    """Stop a live display so that what is printed next starts on a line of its own: on a
    console that is not a terminal (``setup.sh demo`` piped, CI logs) rich leaves the last
    frame without its final newline (``└───┘report written: …``)."""
    live.stop()
    if not live.console.is_terminal and not live.transient:
        live.console.line()


class RunDisplay:
    """Progress bar (iterations of endTime, ETA), solver timings, residuals, per-rank CPU."""

    def __init__(self, title: str, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.completed}/{task.total} it"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task(title, total=None)
        self.table = Table()
        self.live = Live(self._render(None), console=self.console, refresh_per_second=4)
        self.launched = False
        self.live.start()

    def _render(self, tick: SimView | None) -> Group:
        if tick is None:
            return Group(self.progress)
        log = tick.log
        info = []
        if log.execution_s is not None:
            info.append(f"ExecutionTime {log.execution_s:g} s  ClockTime {log.clock_s:g} s")
        if log.residuals:
            info.append(
                "initial residuals: "
                + "  ".join(f"{k} {v:.2e}" for k, v in list(log.residuals.items())[:6])
            )
        table = Table(box=None, pad_edge=False)
        table.add_column("rank", justify="right")
        table.add_column("request", justify="right")
        table.add_column("limit", justify="right")
        table.add_column("CPU now", justify="right")
        table.add_column("throttled", justify="right")
        with_duty = any(r.duty is not None for r in tick.ranks)
        if with_duty:
            table.add_column("duty", justify="right")
        for r in tick.ranks:
            row = [
                str(r.rank),
                f"{r.request_millis}m",
                f"{r.limit_millis}m" if r.limit_millis is not None else "-",
                f"{r.cpu_cores * 1000:.0f}m",
                str(r.nr_throttled),
            ]
            if with_duty:
                row.append(f"{r.duty:.0%}" if r.duty is not None else "?")
            table.add_row(*row)
        if with_duty and all(r.duty is not None for r in tick.ranks):
            used = sum(r.cpu_cores for r in tick.ranks)
            waiting = sum((1 - (r.duty or 0.0)) * r.cpu_cores for r in tick.ranks)
            info.append(
                f"waiting inside MPI: {waiting:.2f} of the {used:.2f} cores in use "
                "(CPU a co-located simulation could use)"
            )
        return Group(self.progress, f"stage: {tick.stage}", *info, table)

    def update(self, now_s: float, sims: Sequence[SimView]) -> None:
        if not sims:
            return
        tick = sims[0]
        self.launched = self.launched or tick.run_id is not None
        total = tick.expected_iterations or None
        self.progress.update(self.task, total=total, completed=tick.log.iterations)
        self.live.update(self._render(tick))

    def close(self) -> None:
        # A case that failed staging never ran: leave only its error message behind.
        if not self.launched:
            self.live.transient = True
        stop_live(self.live)
