"""Duty cycle and reclaimable capacity (seed 001 §3, eqs. 1-3), as pure functions.

d = t_compute / (t_compute + t_MPI) over a time span (eq. 1); the steady-state duty is the
time-weighted value after skipping the start of the run (eq. 2: sums of times, not a mean
of ratios); c_i = r_i (1 - d_i) is the CPU a rank leaves idle (eq. 3).

The solver-agnostic form works on cumulative counters sampled from the live records
(`Counters`); the per-iteration form needs per-call events (trace mode) and the iteration
boundary times from the solver log, in the same clock (CLOCK_MONOTONIC).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Counters:
    """A rank's cumulative compute and MPI time at one instant."""

    t_ns: int
    compute_ns: int
    mpi_ns: int


@dataclass(frozen=True)
class CallEvent:
    """One intercepted MPI call (trace mode), times in microseconds."""

    rank: int
    function: str
    enter_us: float
    exit_us: float


def duty_between(a: Counters, b: Counters) -> float | None:
    """Eq. 1 over the span from sample a to sample b; None if no time passed."""
    compute = b.compute_ns - a.compute_ns
    mpi = b.mpi_ns - a.mpi_ns
    if compute < 0 or mpi < 0:
        raise ValueError("counters decreased: samples out of order or from different runs")
    total = compute + mpi
    return compute / total if total > 0 else None


def steady_state_start(samples: Sequence[Counters], skip_fraction: float = 0.1) -> int:
    """Index of the first sample at or after `skip_fraction` of the sampled time span."""
    if not 0.0 <= skip_fraction < 1.0:
        raise ValueError("skip_fraction must be in [0, 1)")
    if not samples:
        raise ValueError("no samples")
    t0, t1 = samples[0].t_ns, samples[-1].t_ns
    cut = t0 + skip_fraction * (t1 - t0)
    times = [s.t_ns for s in samples]
    return min(bisect.bisect_left(times, cut), len(samples) - 1)


def steady_state_duty(samples: Sequence[Counters], skip_fraction: float = 0.1) -> float | None:
    """Eq. 2 from cumulative samples: duty from the end of the skipped part to the last sample.

    Cumulative counters make the time-weighted sum over windows a single difference.
    """
    start = steady_state_start(samples, skip_fraction)
    return duty_between(samples[start], samples[-1])


def window_duties(samples: Sequence[Counters]) -> list[float | None]:
    """Duty over each span between consecutive samples."""
    return [duty_between(a, b) for a, b in itertools.pairwise(samples)]


def iteration_duties(
    events: Sequence[CallEvent], boundaries_us: Sequence[float]
) -> list[tuple[float, float]]:
    """Per-iteration (compute_us, mpi_us) of one rank, eq. 1's numerator and denominator parts.

    Iteration k spans [boundaries_us[k], boundaries_us[k+1]); MPI time is the overlap of the
    calls with that span, compute time the rest. Events must be of one rank.
    """
    if any(b2 < b1 for b1, b2 in itertools.pairwise(boundaries_us)):
        raise ValueError("iteration boundaries must be non-decreasing")
    calls = sorted((e.enter_us, e.exit_us) for e in events)
    enters = [c[0] for c in calls]
    out: list[tuple[float, float]] = []
    for lo, hi in itertools.pairwise(boundaries_us):
        mpi = 0.0
        # Calls are disjoint per rank: start from the last call entered before `lo`.
        i = max(bisect.bisect_right(enters, lo) - 1, 0)
        while i < len(calls) and calls[i][0] < hi:
            mpi += max(0.0, min(calls[i][1], hi) - max(calls[i][0], lo))
            i += 1
        out.append((hi - lo - mpi, mpi))
    return out


def steady_state_iteration_duty(
    per_iteration: Sequence[tuple[float, float]], skip_fraction: float = 0.1
) -> float | None:
    """Eq. 2: sum of compute over sum of (compute + MPI) for iterations k >= k0."""
    k0 = int(len(per_iteration) * skip_fraction)
    compute = sum(c for c, _ in per_iteration[k0:])
    total = sum(c + m for c, m in per_iteration[k0:])
    return compute / total if total > 0 else None


def reclaimable_millis(
    requests_millis: Sequence[float], duties: Sequence[float | None]
) -> tuple[list[float], float]:
    """Eq. 3: c_i = r_i (1 - d_i) per rank and C = sum c_i. Unknown duty counts as fully busy."""
    if len(requests_millis) != len(duties):
        raise ValueError("one request per duty cycle")
    per_rank = [
        r * (1.0 - d) if d is not None else 0.0
        for r, d in zip(requests_millis, duties, strict=True)
    ]
    return per_rank, sum(per_rank)
