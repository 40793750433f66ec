"""Formulas of the linear contention model against hand-computed values, and bad input."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankpack.errors import UserError
from rankpack.model.contention import (
    MeasuredPoint,
    fit_beta,
    makespan_s,
    parse_point,
    slowdown,
    throughput,
)
from rankpack.model.shape import ClusterShape

PAPER = ClusterShape(ranks=16, nodes=12, cpus_per_node=8)


def test_rho_by_hand() -> None:
    # rho_N = N R / (M C) = N * 16 / 96
    assert PAPER.rho(1) == pytest.approx(1 / 6)
    assert PAPER.rho(2) == pytest.approx(1 / 3)
    assert PAPER.delta_rho(4) == pytest.approx(0.5)
    assert PAPER.pods_per_node(5) == pytest.approx(80 / 12)
    assert PAPER.max_n_within_rho() == 6


def test_throughput_and_makespan_by_hand() -> None:
    # beta = 0.6, N = 3: 1 + 0.6 * 2/6 = 1.2 -> Theta = 2.5, T_3 = 1.2 T_1
    assert slowdown(3, 0.6, PAPER) == pytest.approx(1.2)
    assert throughput(3, 0.6, PAPER) == pytest.approx(2.5)
    assert makespan_s(3, 0.6, PAPER, 1000.0) == pytest.approx(1200.0)
    # beta = 0 is ideal scaling
    assert throughput(5, 0.0, PAPER) == pytest.approx(5.0)


@given(beta=st.floats(0, 50), ranks=st.integers(1, 64), nodes=st.integers(1, 32))
def test_theta_of_one_is_one(beta: float, ranks: int, nodes: int) -> None:
    shape = ClusterShape(ranks=ranks, nodes=nodes, cpus_per_node=8)
    assert throughput(1, beta, shape) == pytest.approx(1.0)


@given(
    b1=st.floats(0, 10),
    b2=st.floats(0, 10),
    n=st.integers(2, 20),
)
def test_throughput_monotone_decreasing_in_beta(b1: float, b2: float, n: int) -> None:
    lo, hi = sorted((b1, b2))
    assert throughput(n, hi, PAPER) <= throughput(n, lo, PAPER) + 1e-12


@given(beta=st.floats(0.01, 3), n=st.integers(2, 10))
def test_fit_recovers_beta_from_exact_data(beta: float, n: int) -> None:
    pts = [MeasuredPoint(k, makespan_s(k, beta, PAPER, 1000.0)) for k in range(1, n + 1)]
    fit = fit_beta(pts, PAPER)
    assert fit.beta == pytest.approx(beta, rel=1e-6)
    assert fit.max_abs_error_pct < 1e-4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0:100", "N must be >= 1"),
        ("-2:100", "N must be >= 1"),
        ("2:0", "positive number of seconds"),
        ("2:-5", "positive number of seconds"),
        ("2:nan", "positive number of seconds"),
        ("2", "not N:makespan_s"),
        ("x:100", "integer N"),
    ],
)
def test_parse_point_rejects_bad_input(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_point(text)


def test_parse_point_ok() -> None:
    assert parse_point("3:1446") == MeasuredPoint(3, 1446.0)


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([MeasuredPoint(1, 100.0)], "at least two points"),
        ([MeasuredPoint(2, 100.0), MeasuredPoint(3, 120.0)], "baseline 1:T1_s"),
        ([MeasuredPoint(1, 100.0), MeasuredPoint(1, 110.0)], "two points for N=1"),
        ([MeasuredPoint(1, 100.0), MeasuredPoint(2, -1.0)], "positive number of seconds"),
        ([MeasuredPoint(0, 100.0), MeasuredPoint(1, 100.0)], "N must be >= 1"),
    ],
)
def test_fit_rejects_bad_points(points: list[MeasuredPoint], message: str) -> None:
    with pytest.raises(UserError, match=message):
        fit_beta(points, PAPER)


def test_calibrate_on_unknown_n() -> None:
    pts = [MeasuredPoint(1, 100.0), MeasuredPoint(2, 110.0)]
    with pytest.raises(UserError, match="calibrate on 3"):
        fit_beta(pts, PAPER, calibrate_on=[3])
    with pytest.raises(UserError, match="at least one N >= 2"):
        fit_beta(pts, PAPER, calibrate_on=[1])


@pytest.mark.parametrize(
    ("ranks", "nodes", "cpus", "message"),
    [(0, 1, 8, "ranks"), (1, 0, 8, "nodes"), (1, 1, 0, "cpus"), (1, 1, math.inf, "cpus")],
)
def test_shape_rejects_bad_input(ranks: int, nodes: int, cpus: float, message: str) -> None:
    with pytest.raises(UserError, match=message):
        ClusterShape(ranks=ranks, nodes=nodes, cpus_per_node=cpus)


def test_n_below_one_and_negative_beta_rejected() -> None:
    with pytest.raises(UserError, match="N must be >= 1"):
        throughput(0, 0.5, PAPER)
    with pytest.raises(UserError, match="beta must be"):
        throughput(2, -0.1, PAPER)


def test_rho_above_one_is_warned() -> None:
    pts = [MeasuredPoint(1, 100.0), MeasuredPoint(2, 110.0), MeasuredPoint(7, 200.0)]
    fit = fit_beta(pts, PAPER)
    assert any("rho=1.17 > 1" in w for w in fit.warnings)


def test_speedup_data_clamps_beta_at_zero() -> None:
    pts = [MeasuredPoint(1, 100.0), MeasuredPoint(2, 90.0), MeasuredPoint(3, 95.0)]
    fit = fit_beta(pts, PAPER)
    assert fit.beta == 0.0
    assert any("no contention" in w for w in fit.warnings)
