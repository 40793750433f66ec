"""CPU-seconds of every rank of a run at once: the same numbers as one rank at a time."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankpack.core.accounting import trapezoid_cpu_s, trapezoid_cpu_s_ranks

SERIES = st.lists(st.integers(0, 3 * 10**9), min_size=30, max_size=30)


@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.floats(0.0, 3.0), max_size=30),
    increments=st.lists(SERIES, min_size=1, max_size=4),
)
def test_all_ranks_at_once_equal_each_rank_alone(
    gaps: list[float], increments: list[list[int]]
) -> None:
    times = [0.0]
    for g in gaps:
        times.append(times[-1] + g)  # repeated times and readings close together included
    usages = []
    for inc in increments:
        u = [0]
        for x in inc[: len(times) - 1]:
            u.append(u[-1] + x)
        usages.append(u)
    together = trapezoid_cpu_s_ranks(times, usages)
    assert together == pytest.approx([trapezoid_cpu_s(times, u) for u in usages], rel=1e-12)
