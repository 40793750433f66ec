"""What a report shows of a run or a multiplex session, read from the store and the run's
solver log and turned into plain series: requests, CPU use, duty cycles, throttling and
progress over time; residuals per iteration; the controller's events.

Pure except for `load_run` / `load_session` (which read the store and the log file).
Called by `rankpack.report.figures` and `rankpack.report.html` (through
`rankpack.report.build`), and by `rankpack demo` for the numbers of its summary.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankpack.case.foamlog import LogParser
from rankpack.core.accounting import rates_from_usage
from rankpack.store import EventRow, RunRow, SampleRow, SessionRow, Store

_CLOCK = re.compile(r"^ExecutionTime = [\d.eE+-]+ s\s+ClockTime = ([\d.eE+-]+) s")


@dataclass(frozen=True)
class RankSeries:
    """One rank's samples, in time order (seconds since the run's launch)."""

    rank: int
    t_s: tuple[float, ...]
    request_millis: tuple[int, ...]
    usage_ns: tuple[int, ...]
    nr_throttled: tuple[int, ...]
    compute_ns: tuple[int | None, ...]
    mpi_ns: tuple[int | None, ...]

    def cpu_cores(self) -> tuple[list[float], list[float]]:
        """CPU use (cores) over each sampling interval, at the interval's midpoint."""
        mid, rate = rates_from_usage(list(self.t_s), list(self.usage_ns))
        return [float(x) for x in mid], [float(x) for x in rate]

    def duty(self) -> tuple[list[float], list[float | None]]:
        """Duty cycle over each sampling interval (compute / (compute + MPI) time), at the
        interval's end; None where the shim said nothing (no shim, or no MPI call yet)."""
        times: list[float] = []
        duty: list[float | None] = []
        for k in range(1, len(self.t_s)):
            c0, c1 = self.compute_ns[k - 1], self.compute_ns[k]
            m0, m1 = self.mpi_ns[k - 1], self.mpi_ns[k]
            times.append(self.t_s[k])
            if None in (c0, c1, m0, m1):
                duty.append(None)
                continue
            dc, dm = int(c1 or 0) - int(c0 or 0), int(m1 or 0) - int(m0 or 0)
            duty.append(dc / (dc + dm) if dc >= 0 and dm >= 0 and dc + dm > 0 else None)
        return times, duty

    def throttled_per_s(self) -> tuple[list[float], list[float]]:
        """Throttled CFS periods per second over each sampling interval."""
        times, rates = [], []
        for k in range(1, len(self.t_s)):
            dt = self.t_s[k] - self.t_s[k - 1]
            if dt > 0:
                times.append(self.t_s[k])
                rates.append(max(0, self.nr_throttled[k] - self.nr_throttled[k - 1]) / dt)
        return times, rates


@dataclass(frozen=True)
class LogHistory:
    """The solver log read whole: residuals per iteration, wall clock per iteration."""

    found: bool
    path: str
    residuals: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """field -> [(iteration, initial residual)]."""
    clock_s: list[tuple[int, float]] = field(default_factory=list)
    """[(iteration, ClockTime)]: OpenFOAM's wall clock since the solver started."""


@dataclass(frozen=True)
class RunData:
    run: RunRow
    ranks: tuple[RankSeries, ...]
    progress: tuple[tuple[float, int], ...]
    """(seconds since launch, iterations done) from the samples."""
    events: tuple[EventRow, ...]
    log: LogHistory

    @property
    def has_duty(self) -> bool:
        return any(d is not None for r in self.ranks for d in r.duty()[1])

    @property
    def throttled_total(self) -> int:
        return sum(r.nr_throttled or 0 for r in self.run.ranks)

    def duty_matrix(self) -> tuple[list[float], list[list[float]]]:
        """Times (interval ends) and a rank x time matrix of duty cycles (NaN: unknown)."""
        if not self.ranks:
            return [], []
        times = self.ranks[0].duty()[0]
        rows = []
        for r in self.ranks:
            t, d = r.duty()
            by_t = dict(zip(t, d, strict=True))
            rows.append([(v if (v := by_t.get(x)) is not None else math.nan) for x in times])
        return times, rows


@dataclass(frozen=True)
class SessionData:
    session: SessionRow
    runs: tuple[RunData, ...]
    events: tuple[EventRow, ...]
    """Every event of the session (its own and its simulations')."""

    @property
    def gain(self) -> float | None:
        value = self.session.summary.get("throughput_gain")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def limit(self) -> float | None:
        value = self.session.summary.get("throughput_limit")
        return float(value) if isinstance(value, (int, float)) else None


# -- loading ------------------------------------------------------------------------------


def load_run(store: Store, run_id: int) -> RunData:
    """A run with its samples, events and solver log (UserError: no such run)."""
    run = store.get_run(run_id)
    samples = store.samples(run_id)
    return RunData(
        run=run,
        ranks=rank_series(samples, run.n_ranks),
        progress=progress(samples),
        events=tuple(store.events(run_id=run_id)),
        log=read_log(Path(run.run_dir) / f"log.{run.solver}"),
    )


def load_session(store: Store, multiplex_id: int) -> SessionData:
    session = store.get_session(multiplex_id)
    runs = tuple(load_run(store, rid) for rid in store.session_run_ids(multiplex_id))
    return SessionData(session, runs, tuple(store.events(multiplex_id=multiplex_id)))


def rank_series(samples: Sequence[SampleRow], n_ranks: int) -> tuple[RankSeries, ...]:
    by_rank: dict[int, list[SampleRow]] = {r: [] for r in range(n_ranks)}
    for s in samples:
        by_rank.setdefault(s.rank, []).append(s)
    out = []
    for rank in sorted(by_rank):
        rows = sorted(by_rank[rank], key=lambda s: s.t_s)
        out.append(
            RankSeries(
                rank=rank,
                t_s=tuple(s.t_s for s in rows),
                request_millis=tuple(s.request_millis for s in rows),
                usage_ns=tuple(s.usage_ns for s in rows),
                nr_throttled=tuple(s.nr_throttled for s in rows),
                compute_ns=tuple(s.compute_ns for s in rows),
                mpi_ns=tuple(s.mpi_ns for s in rows),
            )
        )
    return tuple(out)


def progress(samples: Sequence[SampleRow]) -> tuple[tuple[float, int], ...]:
    seen: dict[float, int] = {}
    for s in samples:
        if s.iterations is not None:
            seen[s.t_s] = max(seen.get(s.t_s, 0), s.iterations)
    return tuple(sorted(seen.items()))


def read_log(path: Path) -> LogHistory:
    """Residuals and wall clock per iteration; ``found=False`` if the log is gone."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return LogHistory(False, str(path))
    return parse_history(text, str(path))


def parse_history(text: str, path: str = "") -> LogHistory:
    parser = LogParser()
    residuals: dict[str, list[tuple[int, float]]] = {}
    clock: list[tuple[int, float]] = []
    done = 0
    for line in text.splitlines():
        parser.feed_line(line)
        state = parser.state
        if state.iterations > done:
            done = state.iterations
            for name, value in state.residuals.items():
                residuals.setdefault(name, []).append((done, value))
            m = _CLOCK.match(line.strip())
            if m:
                clock.append((done, float(m.group(1))))
    return LogHistory(True, path, residuals, clock)


# -- derived numbers -------------------------------------------------------------------------


@dataclass(frozen=True)
class IterationPace:
    """Steady seconds per iteration, start-up left out."""

    seconds_per_iteration: float | None
    """None when fewer than two iterations were seen apart in time."""
    iterations: int
    first_iteration_s: float | None
    """When the first iteration was seen (start-up: reading the mesh, first solve)."""
    lower_bound: bool = False
    """True when no iteration finished after the first: the pace is at least this slow."""


def iteration_pace(
    points: Sequence[tuple[float, int]], end_s: float | None = None
) -> IterationPace:
    """From (time, iterations done) points: (t_last - t_first) / (i_last - i_first), where
    the first point is the first with an iteration done. If none finished after it, the time
    since then up to ``end_s`` is a lower bound of one iteration's time."""
    done = [(t, i) for t, i in points if i >= 1]
    if not done:
        if end_s is not None and end_s > 0:
            return IterationPace(end_s, 0, None, lower_bound=True)
        return IterationPace(None, 0, None)
    t0, i0 = done[0]
    t1, i1 = done[-1]
    if i1 > i0 and t1 > t0:
        return IterationPace((t1 - t0) / (i1 - i0), i1, t0)
    if end_s is not None and end_s > t0:
        return IterationPace(end_s - t0, i1, t0, lower_bound=True)
    return IterationPace(None, i1, t0)


@dataclass(frozen=True)
class RankWork:
    """What one rank did over a run: CPU use split into computing and waiting."""

    rank: int
    cells: int | None
    duty: float | None
    cpu_cores: float
    """Mean CPU use (CPU-seconds / wall seconds)."""
    request_first: int
    request_last: int

    @property
    def computing_cores(self) -> float | None:
        return None if self.duty is None else self.duty * self.cpu_cores

    @property
    def waiting_cores(self) -> float | None:
        """CPU spent inside MPI (spinning): what a co-located simulation could use."""
        return None if self.duty is None else (1 - self.duty) * self.cpu_cores


def rank_work(data: RunData) -> list[RankWork]:
    run = data.run
    wall = run.wall_s or 0.0
    out = []
    for r in run.ranks:
        series = data.ranks[r.rank] if r.rank < len(data.ranks) else None
        first = series.request_millis[0] if series and series.request_millis else r.cpu_millis
        cpu = (r.cpu_s or 0.0) / wall if wall > 0 else 0.0
        out.append(RankWork(r.rank, r.cells, r.duty, cpu, first, r.cpu_millis))
    return out


def event_text(e: EventRow) -> tuple[str, str]:
    """(reason, other details) of an event, for a table."""
    detail: dict[str, Any] = dict(e.detail)
    reason = str(detail.pop("reason", "") or "")
    rest = ", ".join(f"{k}={v}" for k, v in detail.items())
    return reason, rest
