"""Live display of the multiplexer: one line per simulation (rich, on stderr)."""

from __future__ import annotations

from rich.console import Console
from rich.live import Live
from rich.table import Table

from rankpack.controller.multiplex import MultiplexDisplay, Running
from rankpack.controller.observations import ControllerState


class MultiplexLive(MultiplexDisplay):
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live = Live(Table(), console=self.console, refresh_per_second=2)
        self.live.start()

    def update(self, now_s: float, running: list[Running], state: ControllerState) -> None:
        table = Table(title=f"rankpack multiplex  t={now_s:.0f}s  running={len(running)}")
        for col in ("run", "case", "stage", "progress", "it/s", "requests", "duty"):
            table.add_column(col, justify="left" if col in ("case", "stage") else "right")
        rates = []
        for r in running:
            tick = r.last_tick
            if tick is None:
                continue
            mem = state.sims.get(r.run.sim_id)
            elapsed = max(tick.elapsed_s, 1e-6)
            rate = tick.log.iterations / elapsed
            rates.append(rate)
            duty = mem.duty if mem and mem.duty else ()
            table.add_row(
                str(r.run.run_id),
                r.submission.case,
                mem.stage if mem else "starting",
                f"{tick.log.iterations}/{tick.expected_iterations}",
                f"{rate:.1f}",
                " ".join(f"{o.request_millis}m" for o in tick.observation.ranks),
                f"{min(duty):.0%}-{max(duty):.0%}" if duty else "-",
            )
        if len(rates) >= 2 and min(rates) > 0:
            table.caption = f"fairness (max/min progress rate): {max(rates) / min(rates):.2f}"
        self.live.update(table)

    def close(self) -> None:
        self.live.stop()
