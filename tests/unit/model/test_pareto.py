"""Knee, cost, request budgets and the capacity plan."""

from __future__ import annotations

import pytest

from rankpack.errors import UserError
from rankpack.model.contention import slowdown
from rankpack.model.pareto import (
    CapacityPlan,
    PlanInputs,
    RequestBudget,
    cost_per_simulation,
    knee,
    plan_capacity,
    request_budget,
)
from rankpack.model.shape import ClusterShape

PAPER = ClusterShape(ranks=16, nodes=12, cpus_per_node=8)


def test_knee_by_hand() -> None:
    # chord from (1,1) to (4,4): gaps 0.5, 0.6, 0 -> knee at N = 3
    assert knee([1.0, 2.5, 3.6, 4.0]) == 3
    # linear: no point above the chord -> N_max
    assert knee([1.0, 2.0, 3.0, 4.0]) == 4
    # convex -> N_max
    assert knee([1.0, 1.2, 2.0, 4.0]) == 4
    # ties go to the smaller N
    assert knee([1.0, 3.0, 4.0, 4.0]) == 2
    assert knee([1.0]) == 1
    assert knee([1.0, 1.5]) == 2
    with pytest.raises(UserError):
        knee([])


def test_cost_by_hand() -> None:
    # 12 nodes x $0.5/h x 3600 s / 2 sims = $3 per simulation
    assert cost_per_simulation(3600, 2, 12, 0.5) == pytest.approx(3.0)
    with pytest.raises(UserError, match="price"):
        cost_per_simulation(3600, 2, 12, -1)


def test_request_budget() -> None:
    assert request_budget(None, 16, 1000) == RequestBudget(16000, 16000)
    assert request_budget([1, 2], 2, 500) == RequestBudget(1000, 750)
    with pytest.raises(UserError, match="one weight per rank"):
        request_budget([1, 2], 3, 500)
    with pytest.raises(UserError, match="rank millis"):
        request_budget(None, 3, 0)


def _plan(quota_millis: int | None, proportional: bool = True, n_max: int = 6) -> CapacityPlan:
    slow = [slowdown(n, 0.524, PAPER) for n in range(1, n_max + 1)]
    return plan_capacity(
        slow,
        PlanInputs(
            shape=PAPER,
            budget=RequestBudget(16000, 5868),
            n_max=n_max,
            t1_s=1249.0,
            price_per_node_hour=4.12 / 12,
            quota_millis=quota_millis,
            proportional=proportional,
        ),
    )


def test_plan_with_a_30_vcpu_quota() -> None:
    plan = _plan(30_000)
    assert plan.max_n_proportional == 5  # 5 x 5.868 = 29.3 vCPU
    assert plan.max_n_equal == 1  # 2 x 16 = 32 vCPU > 30
    assert plan.knee_n == 3
    assert plan.recommended_n == 3
    row3 = plan.rows[2]
    assert row3.efficiency == pytest.approx(row3.throughput / 3)
    assert row3.degradation_pct == pytest.approx((slowdown(3, 0.524, PAPER) - 1) * 100)
    assert row3.cost_per_sim is not None and row3.makespan_s is not None


def test_plan_equal_allocation_limited_by_quota() -> None:
    plan = _plan(30_000, proportional=False)
    assert plan.recommended_n == 1


def test_plan_without_quota_uses_the_cluster() -> None:
    plan = _plan(None)
    assert plan.cluster_millis == 96_000
    assert plan.max_n_equal == 6  # 6 x 16 = 96 vCPU: exactly the cluster
    assert plan.max_n_proportional == 6


def test_plan_nothing_fits() -> None:
    plan = _plan(1_000)
    assert plan.recommended_n == 0
    assert plan.warnings and "not even one" in plan.warnings[0]
