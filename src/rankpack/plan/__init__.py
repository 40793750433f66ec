"""Plan layer: turns per-rank weights (cell counts, measured duty cycles) into CPU requests."""

from rankpack.plan.allocation import Plan, QoS, RankAllocation, make_plan, parse_weights

__all__ = ["Plan", "QoS", "RankAllocation", "make_plan", "parse_weights"]
