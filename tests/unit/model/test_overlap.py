"""P(>=2) and the duty-cycle predictor against hand-computed values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankpack.errors import UserError
from rankpack.model.overlap import (
    implied_beta,
    p_overlap,
    parse_duty_cycles,
    predict_from_duty_cycles,
)
from rankpack.model.shape import ClusterShape

PAPER = ClusterShape(ranks=16, nodes=12, cpus_per_node=8)
PAPER_DUTY = [0.05] * 8 + [0.115] * 4 + [0.194] * 4


def test_p_overlap_by_hand() -> None:
    # K = 2, d = 0.5: 1 - 0.25 - 2 * 0.5 * 0.5 = 0.25
    assert p_overlap(2, 0.5) == pytest.approx(0.25)
    # K = 3, d = 0.1: 1 - 0.729 - 3 * 0.1 * 0.81 = 0.028
    assert p_overlap(3, 0.1) == pytest.approx(0.028)
    assert p_overlap(5, 0.0) == 0.0
    assert p_overlap(0.5, 0.3) == 0.0
    assert p_overlap(4, 1.0) == pytest.approx(1.0)


@given(k=st.floats(1, 64), d=st.floats(0, 1))
def test_p_overlap_is_a_probability(k: float, d: float) -> None:
    assert 0.0 <= p_overlap(k, d) <= 1.0


@given(k=st.integers(2, 30), d1=st.floats(0, 1), d2=st.floats(0, 1))
def test_p_overlap_monotone_in_duty(k: int, d1: float, d2: float) -> None:
    lo, hi = sorted((d1, d2))
    assert p_overlap(k, lo) <= p_overlap(k, hi) + 1e-12


@pytest.mark.parametrize("d", [-0.1, 1.5, float("nan")])
def test_p_overlap_rejects_bad_duty(d: float) -> None:
    with pytest.raises(UserError, match="between 0 and 1"):
        p_overlap(3, d)


def test_parse_duty_cycles() -> None:
    assert parse_duty_cycles("8x0.05,4x0.115,4x0.194") == PAPER_DUTY
    assert parse_duty_cycles("5%, 0.2") == [0.05, 0.2]
    with pytest.raises(UserError, match="between 0 and 1"):
        parse_duty_cycles("1.5")
    with pytest.raises(UserError, match="not a number"):
        parse_duty_cycles("abc")
    with pytest.raises(UserError, match="integer count"):
        parse_duty_cycles("ax0.1")


def test_duty_predictor_by_hand() -> None:
    # One rank per simulation on one node, d = 0.5. N = 1: alone, stretch 1, E = 0.5.
    # N = 2: one other pod computing with prob. 0.5 -> stretch 1 or 2, E = 0.5 * 1.5.
    shape = ClusterShape(ranks=1, nodes=1, cpus_per_node=8)
    pred = predict_from_duty_cycles(2, [0.5], shape)
    assert pred.slowdown == pytest.approx(1.25)
    assert pred.throughput == pytest.approx(1.6)
    assert pred.p_overlap == pytest.approx(0.25)
    # Two memory streams: a second computing pod costs nothing.
    assert predict_from_duty_cycles(2, [0.5], shape, mem_streams=2).slowdown == pytest.approx(1.0)


def test_duty_predictor_cpu_oversubscription() -> None:
    # 1 vCPU, B large: two computing pods share one CPU -> stretch 2 when both compute.
    shape = ClusterShape(ranks=1, nodes=1, cpus_per_node=1)
    pred = predict_from_duty_cycles(2, [1.0], shape, mem_streams=100)
    assert pred.slowdown == pytest.approx(2.0)


def test_duty_predictor_idle_ranks_cost_nothing() -> None:
    assert predict_from_duty_cycles(4, [0.0] * 16, PAPER).slowdown == pytest.approx(1.0)


def test_duty_predictor_on_paper_data() -> None:
    preds = [predict_from_duty_cycles(n, PAPER_DUTY, PAPER) for n in range(1, 6)]
    assert preds[0].slowdown == pytest.approx(1.0)
    slow = [p.slowdown for p in preds]
    assert slow == sorted(slow)
    # Measured T_N/T_1: 1.129, 1.158, 1.284, 1.337; predictor within 8 %, optimistic.
    measured = [1410 / 1249, 1446 / 1249, 1604 / 1249, 1670 / 1249]
    errs = [(s - m) / m * 100 for s, m in zip(slow[1:], measured, strict=True)]
    assert all(-8.0 < e < 0 for e in errs)
    assert implied_beta(preds, PAPER) == pytest.approx(0.384, abs=0.001)


def test_duty_predictor_needs_one_value_per_rank() -> None:
    with pytest.raises(UserError, match="one duty cycle per rank"):
        predict_from_duty_cycles(2, [0.1] * 3, PAPER)
    with pytest.raises(UserError, match="mem streams"):
        predict_from_duty_cycles(2, PAPER_DUTY, PAPER, mem_streams=0)
