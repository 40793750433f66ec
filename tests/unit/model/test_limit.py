"""The work-conserving limit on co-location's throughput gain, against hand-computed values
and as properties (at most N, at most capacity / C1, non-decreasing in N)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankpack.errors import UserError
from rankpack.model.limit import (
    SingleRun,
    compute_cores,
    gain_limit,
    mixed_gain_limit,
    rank_compute_cores,
)


def test_facts_example_two_weighted_pitzdaily_on_two_cores() -> None:
    # FACTS.md: 2 ranks, cells 1:3; the big rank computes all the time (duty 1), the small
    # one a third of it: C1 = 1/3 + 1 = 1.33 cores; P = 2 -> 2 / 1.333 = 1.5
    c1 = compute_cores([1 / 3, 1.0], [1.0, 1.0], "spin")
    assert c1 == pytest.approx(4 / 3)
    assert gain_limit(2, c1, 2.0) == pytest.approx(1.5)
    assert gain_limit(1, c1, 2.0) == 1.0
    assert gain_limit(3, c1, 2.0) == pytest.approx(1.5)  # capacity binds from N = 2 on


def test_by_hand() -> None:
    # 4 ranks, duty 0.25 each, one core each: C1 = 1 core on 4 cores -> up to 4x
    assert gain_limit(2, 1.0, 4.0) == 2.0  # N binds
    assert gain_limit(8, 1.0, 4.0) == 4.0  # capacity binds
    # a simulation that computes on every core gains nothing
    assert gain_limit(5, 2.0, 2.0) == 1.0
    # more compute than capacity (inconsistent input) is capped: no gain, never a loss
    assert gain_limit(3, 3.0, 2.0) == 1.0
    assert gain_limit(7, 0.0, 2.0) == 7.0


def test_rank_compute_cores_by_wait_mode() -> None:
    # spinning: on its CPU all the time at 0.5 cores (4 ranks on 2 cores), computing 40 %
    assert rank_compute_cores(0.4, 0.5, "spin") == pytest.approx(0.2)
    assert rank_compute_cores(0.4, 0.5, "auto") == pytest.approx(0.2)
    # polite: the CPU it used is compute (plus back-off), capped by its duty
    assert rank_compute_cores(0.4, 0.45, "polite") == pytest.approx(0.4)
    assert rank_compute_cores(0.4, 0.3, "adaptive") == pytest.approx(0.3)


def test_mixed_by_hand() -> None:
    # T = 10 s on 1 core and 20 s on 0.5 cores, P = 1: work 10 + 10 = 20 core-s -> 20 s;
    # sequential 30 s -> 1.5x
    sims = [SingleRun(10.0, 1.0), SingleRun(20.0, 0.5)]
    assert mixed_gain_limit(sims, 1.0) == pytest.approx(1.5)
    # identical simulations reduce to min(N, P / C1)
    same = [SingleRun(7.0, 4 / 3)] * 2
    assert mixed_gain_limit(same, 2.0) == pytest.approx(gain_limit(2, 4 / 3, 2.0))


@pytest.mark.parametrize(
    "call",
    [
        lambda: gain_limit(0, 1.0, 2.0),
        lambda: gain_limit(2, -1.0, 2.0),
        lambda: gain_limit(2, 1.0, 0.0),
        lambda: gain_limit(2, float("nan"), 2.0),
        lambda: rank_compute_cores(1.5, 1.0),
        lambda: compute_cores([0.5], [1.0, 1.0]),
        lambda: mixed_gain_limit([], 2.0),
        lambda: mixed_gain_limit([SingleRun(0.0, 1.0)], 2.0),
    ],
)
def test_bad_input_is_a_user_error(call: object) -> None:
    with pytest.raises(UserError):
        call()  # type: ignore[operator]


cores = st.floats(min_value=0.0, max_value=64.0, allow_nan=False)
capacity = st.floats(min_value=0.01, max_value=64.0, allow_nan=False)


@given(n=st.integers(1, 64), c1=cores, p=capacity)
def test_limit_is_at_most_n_and_capacity_over_compute(n: int, c1: float, p: float) -> None:
    g = gain_limit(n, c1, p)
    assert 1.0 - 1e-12 <= g <= n
    if c1 > 0:
        assert g <= max(1.0, p / c1) * (1 + 1e-12)


@given(n=st.integers(1, 63), c1=cores, p=capacity)
def test_limit_is_monotone_in_n(n: int, c1: float, p: float) -> None:
    assert gain_limit(n + 1, c1, p) >= gain_limit(n, c1, p)


@given(
    sims=st.lists(
        st.builds(SingleRun, st.floats(0.1, 1000.0), st.floats(0.0, 8.0)), min_size=1, max_size=8
    ),
    p=capacity,
)
def test_mixed_limit_is_at_most_n_and_at_least_one(sims: list[SingleRun], p: float) -> None:
    g = mixed_gain_limit(sims, p)
    assert 1.0 - 1e-9 <= g <= len(sims) * (1 + 1e-12)
