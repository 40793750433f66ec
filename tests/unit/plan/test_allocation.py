from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankpack.errors import UserError
from rankpack.plan.allocation import (
    QoS,
    budget_to_millis,
    make_plan,
    parse_weights,
    proportional_millis,
    resolve_weights,
)


def test_seed_000_example_sums_exactly_to_budget() -> None:
    plan = make_plan([1, 1, 5, 15], 4000)
    assert [r.cpu_millis for r in plan.ranks] == [182, 182, 909, 2727]
    assert plan.total_millis == 4000
    assert all(r.limit_millis is None for r in plan.ranks)


def test_grouped_weights_16_ranks() -> None:
    weights = parse_weights("8x1,4x5,4x15")
    assert weights == [1.0] * 8 + [5.0] * 4 + [15.0] * 4
    millis = proportional_millis(weights, 16000)
    assert millis == [182] * 8 + [909] * 4 + [2727] * 4
    assert sum(millis) == 16000


def test_limits_qos_sets_limit_equal_to_request() -> None:
    plan = make_plan([1, 3], 2000, qos=QoS.LIMITS)
    assert [(r.cpu_millis, r.limit_millis) for r in plan.ranks] == [(500, 500), (1500, 1500)]


def test_floor_pins_small_ranks_and_keeps_exact_sum() -> None:
    millis = proportional_millis([1, 1, 5, 15], 4000, floor_millis=250)
    assert millis[:2] == [250, 250]
    assert sum(millis) == 4000
    # the rest is shared 5:15 between ranks 2 and 3
    assert millis[2:] == [875, 2625]


def test_floor_too_large_for_budget_is_an_error() -> None:
    with pytest.raises(UserError, match="too small"):
        proportional_millis([1, 1], 100, floor_millis=60)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1,0,3", "positive"),
        ("1,-2", "positive"),
        ("1,abc", "not a number"),
        ("", "empty"),
        ("1,nan", "positive"),
        ("0x3", "count below 1"),
    ],
)
def test_bad_weights(text: str, match: str) -> None:
    with pytest.raises(UserError, match=match):
        parse_weights(text)


def test_weights_count_must_match_ranks() -> None:
    with pytest.raises(UserError, match="3 values but ranks is 4"):
        resolve_weights("1,2,3", 4, False)


def test_equal_needs_ranks() -> None:
    assert resolve_weights(None, 3, True) == [1.0, 1.0, 1.0]
    with pytest.raises(UserError, match="ranks"):
        resolve_weights(None, None, True)


@pytest.mark.parametrize("cores", [0.0, -1.0, float("inf"), 0.0001])
def test_bad_budget(cores: float) -> None:
    with pytest.raises(UserError):
        budget_to_millis(cores)


@given(
    weights=st.lists(st.floats(min_value=0.01, max_value=1000), min_size=1, max_size=64),
    total=st.integers(min_value=64, max_value=256_000),
    floor=st.integers(min_value=0, max_value=200),
)
def test_property_exact_sum_floor_and_order(weights: list[float], total: int, floor: int) -> None:
    if floor * len(weights) > total:
        with pytest.raises(UserError):
            proportional_millis(weights, total, floor)
        return
    millis = proportional_millis(weights, total, floor)
    assert sum(millis) == total
    assert all(m >= floor for m in millis)
    # a heavier rank never gets less than a lighter one
    for i in range(len(weights)):
        for j in range(len(weights)):
            if weights[i] > weights[j]:
                assert millis[i] >= millis[j]
    # without a floor every rank is within one millicore of its exact share
    if floor == 0:
        wsum = sum(weights)
        for w, m in zip(weights, millis, strict=True):
            assert abs(m - total * w / wsum) < 1.0 + 1e-6
