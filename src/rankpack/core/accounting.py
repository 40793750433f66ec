"""CPU accounting: CPU-seconds and rates from cumulative usage samples.

CPU-seconds per rank are integrated from the ~1 Hz usage samples with the trapezoidal rule
(seed 000 eq. 7, what a user of `kubectl top` would do) and checked against the rank pod's
own cumulative counter, which is exact; both are kept. Called by the controller while it
records a run and by the report to draw CPU use over time.
"""

from __future__ import annotations

import numpy as np


def rates_from_usage(times_s: list[float], usage_ns: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """CPU rate (cores) over each sampling interval, placed at the interval's midpoint."""
    times_s, usage_ns = _merge_close(times_s, usage_ns)
    t = np.asarray(times_s, dtype=float)
    u = np.asarray(usage_ns, dtype=float)
    if len(t) < 2:
        return np.zeros(0), np.zeros(0)
    dt = np.diff(t)
    dt[dt <= 0] = np.nan
    rate = np.diff(u) / 1e9 / dt
    mid = (t[:-1] + t[1:]) / 2
    ok = np.isfinite(rate)
    return mid[ok], rate[ok]


def _merge_close(times_s: list[float], usage_ns: list[int]) -> tuple[list[float], list[int]]:
    """Fold a sample taken right after the previous one (the final reading at exit) into it.

    A near-zero interval gives a meaningless rate that would drag the trapezoid's last
    segment down; the later reading (more complete usage) replaces the earlier one.
    """
    if len(times_s) < 3:
        return list(times_s), list(usage_ns)
    typical = float(np.median(np.diff(times_s)))
    out_t, out_u = [times_s[0]], [usage_ns[0]]
    for t, u in zip(times_s[1:], usage_ns[1:], strict=True):
        if t - out_t[-1] < 0.2 * typical and len(out_t) > 1:
            out_t[-1], out_u[-1] = t, u
        else:
            out_t.append(t)
            out_u.append(u)
    return out_t, out_u


def trapezoid_cpu_s(times_s: list[float], usage_ns: list[int]) -> float:
    """CPU-seconds from rate samples by the trapezoidal rule over the sampled span.

    The rate is known at interval midpoints; it is held flat to the first and last sample
    times, so a constant rate integrates exactly.
    """
    mid, rate = rates_from_usage(times_s, usage_ns)
    if len(mid) == 0:
        return 0.0
    t = np.concatenate(([times_s[0]], mid, [times_s[-1]]))
    r = np.concatenate(([rate[0]], rate, [rate[-1]]))
    return float(np.trapezoid(r, t))
