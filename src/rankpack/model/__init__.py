"""Throughput model and capacity planner for co-located MPI simulations (seed 001 §3.4, §5.3, §6).

Modules: `shape`: the cluster and its load rho; `contention`: the linear model and its fit;
`overlap`: compute-overlap probability and the duty-cycle predictor; `limit`: the physical
limit of co-location (a work-conserving bound on the gain); `pareto`: efficiency, knee, cost
and request budgets; `warnings`: where the model is known to break; `plots`: PNG figures.
Pure, except `plots`.
"""

from rankpack.model.contention import (
    FitResult,
    MeasuredPoint,
    fit_beta,
    makespan_s,
    throughput,
)
from rankpack.model.overlap import p_overlap, predict_from_duty_cycles
from rankpack.model.pareto import knee, plan_capacity
from rankpack.model.shape import ClusterShape

__all__ = [
    "ClusterShape",
    "FitResult",
    "MeasuredPoint",
    "fit_beta",
    "knee",
    "makespan_s",
    "p_overlap",
    "plan_capacity",
    "predict_from_duty_cycles",
    "throughput",
]
