"""Per-rank duty cycles of a running simulation, for the run driver's display and results.

Reads the shim's live records without blocking (seqlock snapshots), keeps the cumulative
counters it saw, and gives both the latest windowed duty (display) and the steady-state
duty over the run with the first part skipped (seed 001 eq. 2), which is stored per rank.
"""

from __future__ import annotations

from pathlib import Path

from rankpack.profile.duty import Counters, steady_state_duty
from rankpack.profile.records import RecordReader, record_path


class DutyTracker:
    def __init__(self, live_dir: Path, n_ranks: int, skip_fraction: float = 0.1) -> None:
        self.live_dir = live_dir
        self.skip_fraction = skip_fraction
        self.readers = [RecordReader(record_path(live_dir, r)) for r in range(n_ranks)]
        self.history: list[list[Counters]] = [[] for _ in range(n_ranks)]

    def live(self) -> tuple[float | None, ...]:
        """Duty over the shim's latest window, per rank (None before there is one)."""
        out: list[float | None] = []
        for rank, reader in enumerate(self.readers):
            rec = reader.snapshot()
            if rec is None:
                out.append(None)
                continue
            hist = self.history[rank]
            if not hist or hist[-1].t_ns != rec.t_update_ns:
                hist.append(Counters(rec.t_update_ns, rec.compute_ns, rec.mpi_ns))
            out.append(rec.window_duty if rec.window_duty is not None else rec.duty)
        return tuple(out)

    def steady(self) -> tuple[float | None, ...]:
        """Steady-state duty per rank over what was seen, the first part skipped."""
        self.live()
        return tuple(
            steady_state_duty(h, self.skip_fraction) if len(h) >= 2 else None for h in self.history
        )

    def close(self) -> None:
        for reader in self.readers:
            reader.close()
