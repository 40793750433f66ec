"""Per-rank duty cycles of a running simulation, for the run driver's display and results.

Reads the shim's live records without blocking (seqlock snapshots) and keeps every new
version it sees, so it can give both the latest windowed duty (display) and the
steady-state summary over the run with the first part skipped (seed 001 eq. 2–3).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rankpack.profile.records import RankRecord, RecordReader, record_path
from rankpack.profile.sampling import ProfileSummary, summarise, take_snapshots


class DutyTracker:
    def __init__(self, live_dir: Path, n_ranks: int, skip_fraction: float = 0.1) -> None:
        self.live_dir = live_dir
        self.n_ranks = n_ranks
        self.skip_fraction = skip_fraction
        self.readers = [RecordReader(record_path(live_dir, r)) for r in range(n_ranks)]
        self.history: dict[int, list[RankRecord]] = {r: [] for r in range(n_ranks)}
        self.closed = False

    def live(self) -> tuple[float | None, ...]:
        """Duty over the shim's latest window, per rank (None before there is one)."""
        if not self.closed:
            take_snapshots(self.readers, self.history)
        out: list[float | None] = []
        for rank in range(self.n_ranks):
            seen = self.history[rank]
            if not seen:
                out.append(None)
                continue
            rec = seen[-1]
            out.append(rec.window_duty if rec.window_duty is not None else rec.duty)
        return tuple(out)

    def counters(self) -> tuple[tuple[int, int] | None, ...]:
        """(compute_ns, mpi_ns) per rank from the latest record `live` read, or None."""
        return tuple(
            (h[-1].compute_ns, h[-1].mpi_ns) if h else None
            for h in (self.history[r] for r in range(self.n_ranks))
        )

    def summary(self, requests_millis: Sequence[float]) -> ProfileSummary:
        self.live()
        return summarise(self.history, requests_millis, self.skip_fraction)

    def steady(self) -> tuple[float | None, ...]:
        """Steady-state duty per rank over what was seen, the first part skipped."""
        return tuple(r.duty for r in self.summary([0.0] * self.n_ranks).ranks)

    def close(self) -> None:
        if not self.closed:
            take_snapshots(self.readers, self.history)
            for reader in self.readers:
                reader.close()
            self.closed = True
