"""Pareto analysis and capacity planning on top of a throughput curve.

For each N: throughput Theta(N), scheduling efficiency Theta(N)/N, per-simulation
degradation T_N/T_1 - 1, cost per simulation at a price per node-hour (seed 001 Table 5),
and the CPU requests N simulations need under equal and proportional allocation (seed 001
§5.2), so a user sees how many simulations fit a ResourceQuota. Pure; called by
`rankpack model plan`.

Knee (docs/model.md): over the candidate range N = 1..N_max, the knee is the N whose
throughput lies furthest above the chord from (1, Theta(1)) to (N_max, Theta(N_max))
(the "Kneedle" criterion: the point of maximum curvature of a discrete concave curve).
Ties go to the smaller N; if no point lies above the chord (throughput linear or
convex: no diminishing returns yet) the knee is N_max.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rankpack import quantities
from rankpack.errors import UserError
from rankpack.model.shape import ClusterShape
from rankpack.quantities import InvalidQuantity

SECONDS_PER_HOUR = 3600.0


def knee(throughputs: Sequence[float]) -> int:
    """Knee of Theta over N = 1..len(throughputs) (1-based), by maximum distance above the chord."""
    if not throughputs:
        raise UserError("the knee needs at least one N")
    n_max = len(throughputs)
    if n_max <= 2:
        return n_max
    first, last = throughputs[0], throughputs[-1]
    slope = (last - first) / (n_max - 1)
    best_n, best_gap = n_max, 0.0
    for i, theta in enumerate(throughputs):
        gap = theta - (first + slope * i)
        if gap > best_gap + 1e-12:
            best_n, best_gap = i + 1, gap
    return best_n


def cost_per_simulation(makespan_s: float, n: int, nodes: int, price_per_node_hour: float) -> float:
    """(M nodes x price x T_N) / N: what one of N co-located simulations costs."""
    if n < 1:
        raise UserError(f"N must be >= 1, got {n}")
    if not math.isfinite(price_per_node_hour) or price_per_node_hour < 0:
        raise InvalidQuantity(f"{{price_per_node_hour}} must be >= 0, got {price_per_node_hour:g}")
    quantities.price(price_per_node_hour, "price_per_node_hour")
    return nodes * price_per_node_hour * makespan_s / SECONDS_PER_HOUR / n


@dataclass(frozen=True)
class RequestBudget:
    """CPU requests of one simulation (millicores), equal vs proportional."""

    equal_millis: int
    """R ranks x the per-rank request (seed 001: 16 x 1000m)."""
    proportional_millis: int
    """Per-rank requests in proportion to weights, the heaviest rank keeping the equal
    request (seed 001: weights 8x1,4x5,4x15 -> 67m, 333m, 1000m; ~5.9 vCPU)."""


def request_budget(weights: Sequence[float] | None, ranks: int, rank_millis: int) -> RequestBudget:
    """Equal: R x rank_millis. Proportional: sum_i round(rank_millis x w_i / max w)."""
    if rank_millis < 1:
        raise InvalidQuantity(f"{{rank_millis}} must be >= 1 millicore, got {rank_millis}")
    quantities.cpu_millis(rank_millis / 1000, "rank_millis", lo=1)
    equal = ranks * rank_millis
    if weights is None:
        return RequestBudget(equal_millis=equal, proportional_millis=equal)
    if len(weights) != ranks:
        raise InvalidQuantity(
            f"{{weights}} has {len(weights)} values but {{ranks}} is {ranks}; "
            "give one weight per rank"
        )
    w_max = max(weights)
    prop = sum(max(1, round(rank_millis * w / w_max)) for w in weights)
    return RequestBudget(equal_millis=equal, proportional_millis=prop)


@dataclass(frozen=True)
class ParetoRow:
    n: int
    rho: float
    throughput: float
    efficiency: float
    """Theta(N) / N."""
    degradation_pct: float
    """(T_N - T_1) / T_1 x 100: how much longer each simulation takes."""
    makespan_s: float | None
    cost_per_sim: float | None
    equal_request_millis: int
    proportional_request_millis: int
    fits_quota_equal: bool
    fits_quota_proportional: bool


@dataclass(frozen=True)
class CapacityPlan:
    rows: tuple[ParetoRow, ...]
    knee_n: int
    recommended_n: int
    max_n_equal: int
    """Largest N whose equal requests fit the quota and the cluster (0 if none)."""
    max_n_proportional: int
    quota_millis: int | None
    cluster_millis: int
    warnings: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "knee_n": self.knee_n,
            "recommended_n": self.recommended_n,
            "max_n_equal": self.max_n_equal,
            "max_n_proportional": self.max_n_proportional,
            "quota_millis": self.quota_millis,
            "cluster_millis": self.cluster_millis,
            "rows": [
                {
                    "n": r.n,
                    "rho": r.rho,
                    "throughput": r.throughput,
                    "efficiency": r.efficiency,
                    "degradation_pct": r.degradation_pct,
                    "makespan_s": r.makespan_s,
                    "cost_per_sim": r.cost_per_sim,
                    "equal_request_millis": r.equal_request_millis,
                    "proportional_request_millis": r.proportional_request_millis,
                    "fits_quota_equal": r.fits_quota_equal,
                    "fits_quota_proportional": r.fits_quota_proportional,
                }
                for r in self.rows
            ],
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class PlanInputs:
    """Everything `plan_capacity` needs besides the throughput curve."""

    shape: ClusterShape
    budget: RequestBudget
    n_max: int
    t1_s: float | None = None
    price_per_node_hour: float | None = None
    quota_millis: int | None = None
    proportional: bool = True
    """Which allocation the recommendation must fit (proportional by default)."""


def plan_capacity(slowdowns: Sequence[float], inputs: PlanInputs) -> CapacityPlan:
    """Pareto rows for N = 1..n_max from T_N / T_1 (``slowdowns[N-1]``), knee and recommendation.

    The recommended N is the knee of the throughput curve over the N whose requests fit
    both the quota and the cluster's allocatable CPU under the chosen allocation.
    """
    quantities.count(inputs.n_max, "max_n", hi=quantities.MAX_SIMULATIONS)
    if len(slowdowns) != inputs.n_max:
        raise ValueError("one slowdown per N = 1..n_max")
    if inputs.quota_millis is not None and inputs.quota_millis < 1:
        raise InvalidQuantity(
            f"{{quota}} must be a positive CPU amount, got {inputs.quota_millis}m"
        )
    shape = inputs.shape
    cluster_millis = round(shape.total_cpus * 1000)
    limit = (
        cluster_millis if inputs.quota_millis is None else min(cluster_millis, inputs.quota_millis)
    )
    rows: list[ParetoRow] = []
    for i, slow in enumerate(slowdowns):
        n = i + 1
        theta = n / slow
        makespan = inputs.t1_s * slow if inputs.t1_s is not None else None
        cost = (
            cost_per_simulation(makespan, n, shape.nodes, inputs.price_per_node_hour)
            if makespan is not None and inputs.price_per_node_hour is not None
            else None
        )
        eq = n * inputs.budget.equal_millis
        prop = n * inputs.budget.proportional_millis
        rows.append(
            ParetoRow(
                n=n,
                rho=shape.rho(n),
                throughput=theta,
                efficiency=theta / n,
                degradation_pct=(slow - 1.0) * 100.0,
                makespan_s=makespan,
                cost_per_sim=cost,
                equal_request_millis=eq,
                proportional_request_millis=prop,
                fits_quota_equal=eq <= limit,
                fits_quota_proportional=prop <= limit,
            )
        )
    max_eq = max((r.n for r in rows if r.fits_quota_equal), default=0)
    max_prop = max((r.n for r in rows if r.fits_quota_proportional), default=0)
    feasible = max_prop if inputs.proportional else max_eq
    warns: list[str] = []
    if feasible == 0:
        alloc = "proportional" if inputs.proportional else "equal"
        warns.append(
            f"not even one simulation's {alloc} requests fit the quota/cluster "
            f"({limit}m); raise the quota or lower --rank-millis"
        )
        knee_n = recommended = 0
    else:
        knee_n = knee([r.throughput for r in rows[:feasible]])
        recommended = knee_n
    return CapacityPlan(
        rows=tuple(rows),
        knee_n=knee_n,
        recommended_n=recommended,
        max_n_equal=max_eq,
        max_n_proportional=max_prop,
        quota_millis=inputs.quota_millis,
        cluster_millis=cluster_millis,
        warnings=tuple(warns),
    )
