"""What N simulations share: the cluster's shape and its normalized load rho (seed 001 §3.4).

`ClusterShape` is used by the contention model, the duty-cycle predictor, the planner and
the warnings of where the model breaks (`rankpack.model.warnings`), so it sits below them
all. Pure computation, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rankpack import quantities
from rankpack.quantities import InvalidQuantity

RHO_VALIDATED = 1.0
"""Above this load there are more rank pods than vCPUs: the linear model is not validated."""


@dataclass(frozen=True)
class ClusterShape:
    """What one simulation needs and what the cluster offers."""

    ranks: int
    """R: MPI ranks (rank pods) per simulation."""
    nodes: int
    """M: worker nodes shared by the simulations."""
    cpus_per_node: float
    """C: allocatable vCPUs per node."""

    def __post_init__(self) -> None:
        quantities.ranks(self.ranks, "ranks")
        quantities.count(self.nodes, "nodes", hi=quantities.MAX_NODES)
        quantities.real(
            self.cpus_per_node,
            "cpus",
            lo=0.0,
            hi=quantities.MAX_CPUS_PER_NODE,
            lo_open=True,
            what="a positive number of vCPUs per node",
        )

    @property
    def total_cpus(self) -> float:
        return self.nodes * self.cpus_per_node

    def rho(self, n: float) -> float:
        """rho_N = N R / (M C): rank pods per vCPU when N simulations share the cluster."""
        check_n(n)
        return n * self.ranks / self.total_cpus

    def delta_rho(self, n: float) -> float:
        """rho_N - rho_1 = (N - 1) R / (M C)."""
        return self.rho(n) - self.rho(1)

    def pods_per_node(self, n: float) -> float:
        """K = N R / M: average rank pods per node."""
        check_n(n)
        return n * self.ranks / self.nodes

    def max_n_within_rho(self, rho_max: float = RHO_VALIDATED) -> int:
        """Largest N with rho_N <= rho_max (at least 1)."""
        return max(1, math.floor(rho_max * self.total_cpus / self.ranks + 1e-9))


def check_n(n: float) -> None:
    if not math.isfinite(n) or n < 1:
        raise InvalidQuantity(f"the number of simulations N must be >= 1, got {n:g}")
