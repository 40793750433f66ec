"""CPU accounting: CPU-seconds and rates from cumulative usage samples.

CPU-seconds per rank are integrated from the ~1 Hz usage samples with the trapezoidal rule
(seed 000 eq. 7, what a user of `kubectl top` would do) and checked against the rank pod's
own cumulative counter, which is exact; both are kept. Called by the controller while it
records a run and by the report to draw CPU use over time.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    with np.errstate(over="ignore"):  # readings a subnormal time apart: inf, dropped below
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
    with np.errstate(over="ignore"):  # (rates a subnormal time apart may sum past float)
        return float(np.trapezoid(r, t))


def trapezoid_cpu_s_ranks(times_s: list[float], usages_ns: Sequence[list[int]]) -> list[float]:
    """`trapezoid_cpu_s` of every rank of a run sampled at the same ``times_s``, at once
    (one array operation for all ranks: a run of many ranks ends in milliseconds). A
    rank whose series is not as long as the times is integrated on its own."""
    out: list[float | None] = [None] * len(usages_ns)
    rows = [i for i, u in enumerate(usages_ns) if len(u) == len(times_s)]
    if rows and len(times_s) >= 2:
        keep = _kept(times_s)
        t = np.asarray(times_s, dtype=float)[keep]
        u = np.asarray([usages_ns[i] for i in rows], dtype=float)[:, keep]
        if len(t) >= 2:
            dt = np.diff(t)
            dt[dt <= 0] = np.nan
            with np.errstate(over="ignore"):  # (an infinite rate: the rank's own, below)
                rate = np.diff(u, axis=1) / 1e9 / dt
            ok = np.isfinite(dt)
            mid, rate = ((t[:-1] + t[1:]) / 2)[ok], rate[:, ok]
            if len(mid):
                tt = np.concatenate(([times_s[0]], mid, [times_s[-1]]))
                rr = np.concatenate((rate[:, :1], rate, rate[:, -1:]), axis=1)
                with np.errstate(invalid="ignore", over="ignore"):  # (inf x 0: left out below)
                    values = np.atleast_1d(np.trapezoid(rr, tt, axis=1))
                # a rate that overflows (readings a subnormal time apart) is left out per
                # rank: such a rank is integrated on its own below
                finite = np.atleast_1d(np.isfinite(rate).all(axis=1)).tolist()
                for i, value, whole in zip(rows, values, finite, strict=True):
                    out[i] = float(value) if whole else None
            else:
                for i in rows:
                    out[i] = 0.0
    return [
        value if value is not None else trapezoid_cpu_s(times_s, list(u))
        for value, u in zip(out, usages_ns, strict=True)
    ]


def _kept(times_s: list[float]) -> list[int]:
    """The indices `_merge_close` keeps (the later of two readings close together)."""
    if len(times_s) < 3:
        return list(range(len(times_s)))
    typical = float(np.median(np.diff(times_s)))
    keep = [0]
    for i in range(1, len(times_s)):
        if times_s[i] - times_s[keep[-1]] < 0.2 * typical and len(keep) > 1:
            keep[-1] = i
        else:
            keep.append(i)
    return keep
