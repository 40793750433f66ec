"""Live display of a multiplex session: one line per simulation (rich, on stderr)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.live import Live
from rich.table import Table

from rankpack.controller.views import SimView
from rankpack.report.live import stop_live


class MultiplexLive:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live = Live(Table(), console=self.console, refresh_per_second=2)
        self.live.start()

    def update(self, now_s: float, sims: Sequence[SimView]) -> None:
        table = Table(title=f"rankpack multiplex  t={now_s:.0f}s  simulations={len(sims)}")
        for col in ("run", "case", "stage", "progress", "it/s", "requests", "duty"):
            table.add_column(col, justify="left" if col in ("case", "stage") else "right")
        rates = []
        for sim in sims:
            elapsed = max(sim.elapsed_s, 1e-6)
            rate = sim.log.iterations / elapsed
            if sim.ranks:
                rates.append(rate)
            duty = [r.duty for r in sim.ranks if r.duty is not None]
            table.add_row(
                str(sim.run_id or "-"),
                sim.case,
                sim.stage,
                f"{sim.log.iterations}/{sim.expected_iterations}",
                f"{rate:.1f}",
                " ".join(f"{r.request_millis}m" for r in sim.ranks),
                f"{min(duty):.0%}-{max(duty):.0%}" if duty else "-",
            )
        if len(rates) >= 2 and min(rates) > 0:
            table.caption = f"fairness (max/min progress rate): {max(rates) / min(rates):.2f}"
        self.live.update(table)

    def close(self) -> None:
        stop_live(self.live)
