"""Plan layer: turns per-rank weights (cell counts, measured duty cycles) into CPU requests.

Modules: `allocation` (per-rank CPU requests proportional to weights, summing to a budget),
`submission` (one simulation to run, and the one validation every way in uses), `images`
(which images a Simulation may run, and which solvers each may run: the admin's allowlist).
"""

from rankpack.plan.allocation import Plan, QoS, RankAllocation, make_plan, parse_weights

__all__ = ["Plan", "QoS", "RankAllocation", "make_plan", "parse_weights"]
