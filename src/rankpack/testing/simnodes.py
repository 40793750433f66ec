"""The simulated cluster's nodes: what each holds, where a launch goes, how fast ranks run.

`NodeLoad` reads the cluster's simulations (it never changes them): the millicores and
ranks on each node, whether a resize fits, the placement of a new simulation, and the
speeds of every running rank (weighted max-min fair, `simmodel.cpu_speeds`) with the
iteration timing that follows from them. The model is documented in
`rankpack.testing.simulated`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rankpack.backend.protocol import (
    LaunchFailed,
    RankPhase,
    RankResources,
    ResizeState,
    SimPhase,
    SimSpec,
)
from rankpack.testing.simmodel import IterationTiming, SimNode, cpu_speeds, iteration_timing
from rankpack.testing.simstate import SimRank, SimRun


@dataclass(frozen=True)
class Timing(IterationTiming):
    """A running simulation's iteration timing and its ranks' speeds (cores)."""

    speeds: tuple[float, ...] = ()


class NodeLoad:
    """The nodes of a cluster and the load its simulations put on them."""

    def __init__(self, nodes: tuple[SimNode, ...], sims: Mapping[str, SimRun], name: str) -> None:
        self.nodes = nodes
        self._sims = sims
        self._name = name

    def node(self, name: str) -> SimNode:
        return next(n for n in self.nodes if n.name == name)

    def charge(self, r: SimRank) -> int:
        """Millicores ``r`` holds on its node: an accepted increase counts while in flight."""
        f = r.in_flight
        if f is not None and f.deferred_until is None and f.outcome is ResizeState.COMPLETED:
            return max(r.allocated.request_millis, f.target.request_millis)
        return r.allocated.request_millis

    def ranks(self, node: str) -> int:
        return sum(1 for s in self._sims.values() if s.active for r in s.ranks if r.node == node)

    def requested(self, node: str) -> int:
        return self.node(node).reserved_millis + sum(
            self.charge(r)
            for sim in self._sims.values()
            if sim.active
            for r in sim.ranks
            if r.node == node
        )

    def fits(self, r: SimRank, target: RankResources) -> bool:
        node = self.node(r.node)
        others = self.requested(node.name) - self.charge(r)
        need = max(r.allocated.request_millis, target.request_millis)
        return others + need <= node.allocatable_millis

    def place(self, spec: SimSpec) -> list[str]:
        """Each rank's node: the pinned one, else the first that holds all, else rank by
        rank the one with the most free millicores. LaunchFailed for an unknown pin."""
        pinned = spec.placement.get("node")
        if pinned is not None:
            if pinned not in {n.name for n in self.nodes}:
                raise LaunchFailed(f"no node {pinned} in cluster {self._name}")
            return [pinned] * len(spec.ranks)
        free = {n.name: n.allocatable_millis - self.requested(n.name) for n in self.nodes}
        total = sum(r.request_millis for r in spec.ranks)
        for n in self.nodes:
            if free[n.name] >= total:
                return [n.name] * len(spec.ranks)
        out = []
        for res in spec.ranks:
            best = max(self.nodes, key=lambda n: free[n.name]).name
            out.append(best)
            free[best] -= res.request_millis
        return out

    def timings(self) -> dict[str, Timing]:
        """Iteration timing of every running simulation at the current speeds."""
        running = [s for s in self._sims.values() if s.phase is SimPhase.RUNNING]
        speeds: dict[tuple[str, int], float] = {}
        for node in self.nodes:
            members = [
                (s.sim_id, r)
                for s in running
                for r in s.ranks
                if r.node == node.name and r.phase is RankPhase.RUNNING
            ]
            weights = [float(max(2, r.allocated.request_millis)) for _, r in members]
            caps = [min(1.0, (r.allocated.limit_millis or 1000) / 1000) for _, r in members]
            if node.reserved_millis > 0:
                weights.append(float(node.reserved_millis))
                caps.append(node.reserved_millis / 1000)
            shares = cpu_speeds(node.allocatable_millis / 1000, weights, caps)
            for (sim_id, r), share in zip(members, shares, strict=False):
                speeds[(sim_id, r.index)] = share
        out = {}
        for sim in running:
            assert sim.case is not None
            rank_speeds = tuple(speeds.get((sim.sim_id, r.index), 0.0) for r in sim.ranks)
            t = iteration_timing(sim.work_s, rank_speeds, sim.case.mpi_s_per_iteration)
            out[sim.sim_id] = Timing(t.iteration_s, t.duty, rank_speeds)
        return out
