"""The simulated cluster's nodes: what each holds, where a launch goes, how fast ranks run.

`SimNodeLoad` keeps, per node, the millicores and ranks of the cluster's active simulations,
which running ranks share its cores, and the speeds they get (weighted max-min fair,
`simmodel.cpu_speeds`) with the iteration timing that follows for every running simulation,
and the nodes as a backend reports them (`inventory`). It is kept up to date incrementally,
so that a cluster of a thousand nodes costs what changes, not nodes x ranks per call:
`SimulatedCluster` tells it when a simulation becomes active (`activate`) or not
(`deactivate`), starts running (`start`), and when a rank's charge or allocation changes
(`recharge`); a node whose running ranks or allocations changed is *dirty* and its speeds
(and the timing of every simulation with a rank on it) are computed again on the next
`timings`. The model is documented in `rankpack.testing.simulated`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rankpack.backend.protocol import (
    Inventory,
    LaunchFailed,
    NodeCapacity,
    RankResources,
    ResizeState,
    SimSpec,
)
from rankpack.testing.simmodel import IterationTiming, SimNode, cpu_speeds, iteration_timing
from rankpack.testing.simstate import SimRank, SimRun


@dataclass(frozen=True)
class Timing(IterationTiming):
    """A running simulation's iteration timing and its ranks' speeds (cores)."""

    speeds: tuple[float, ...] = ()


class SimNodeLoad:
    """The nodes of a cluster and the load its simulations put on them."""

    def __init__(self, nodes: tuple[SimNode, ...], sims: Mapping[str, SimRun], name: str) -> None:
        self.nodes = nodes
        self._by_name = {n.name: n for n in nodes}
        self._sims = sims
        self._name = name
        self._requested = {n.name: n.reserved_millis for n in nodes}
        self._ranks = dict.fromkeys(self._by_name, 0)
        self._running: dict[str, set[str]] = {n.name: set() for n in nodes}
        """Per node, the running simulations with a rank on it."""
        self._speeds: dict[tuple[str, int], float] = {}
        self._timings: dict[str, Timing] = {}
        self._dirty: set[str] = set()
        self.version = 0
        """Goes up whenever what a node holds changes (an inventory is cached by it)."""
        self.changed: set[str] = set()
        """The nodes whose ranks or requests changed since the last `inventory` (it
        rebuilds only those)."""
        self._inventory: tuple[int, Inventory] | None = None
        self._node_index = {n.name: i for i, n in enumerate(nodes)}
        self._node_caps: list[NodeCapacity] = []

    def inventory(self) -> Inventory:
        """The nodes as a backend reports them (cached until what a node holds changes)."""
        cached = self._inventory
        if cached is not None and cached[0] == self.version:
            return cached[1]
        # only the nodes whose load changed get a new NodeCapacity (the others keep theirs:
        # a reader may compare them by identity)
        if not self._node_caps:
            self._node_caps = [self._node_capacity(i) for i in range(len(self.nodes))]
        for name in self.changed:
            i = self._node_index[name]
            self._node_caps[i] = self._node_capacity(i)
        self.changed = set()
        inventory = Inventory(tuple(self._node_caps))
        self._inventory = (self.version, inventory)
        return inventory

    def _node_capacity(self, i: int) -> NodeCapacity:
        name = self.nodes[i].name
        return NodeCapacity(name, self.nodes[i].allocatable_millis, self.requested(name),
                            self.ranks(name))  # fmt: skip

    def node(self, name: str) -> SimNode:
        return self._by_name[name]

    def charge(self, r: SimRank) -> int:
        """Millicores ``r`` holds on its node: an accepted increase counts while in flight."""
        f = r.in_flight
        if f is not None and f.deferred_until is None and f.outcome is ResizeState.COMPLETED:
            return max(r.allocated.request_millis, f.target.request_millis)
        return r.allocated.request_millis

    def ranks(self, node: str) -> int:
        return self._ranks[node]

    def requested(self, node: str) -> int:
        return self._requested[node]

    # -- what the cluster tells it -----------------------------------------------------------

    def activate(self, sim: SimRun) -> None:
        """``sim`` was launched: its ranks count on their nodes."""
        for r in sim.ranks:
            self._ranks[r.node] += 1
            self.changed.add(r.node)
            self.recharge(r)
        self.version += 1

    def deactivate(self, sim: SimRun) -> None:
        """``sim`` ended: its ranks no longer count, nor run."""
        for r in sim.ranks:
            self._ranks[r.node] -= 1
            self._requested[r.node] -= r.charged
            self.changed.add(r.node)
            r.charged = 0
            self._speeds.pop((sim.sim_id, r.index), None)
            running = self._running[r.node]
            if sim.sim_id in running:
                running.discard(sim.sim_id)
                self._dirty.add(r.node)
        self._timings.pop(sim.sim_id, None)
        self.version += 1

    def start(self, sim: SimRun) -> None:
        """``sim``'s ranks run from now on."""
        for r in sim.ranks:
            self._running[r.node].add(sim.sim_id)
            self._dirty.add(r.node)

    def recharge(self, r: SimRank, *, allocated_changed: bool = False) -> None:
        """``r``'s in-flight resize or allocation changed (its simulation is active)."""
        new = self.charge(r)
        if new != r.charged:
            self._requested[r.node] += new - r.charged
            r.charged = new
            self.changed.add(r.node)
            self.version += 1
        if allocated_changed:
            self._dirty.add(r.node)

    def sims_on(self, nodes: Iterable[str]) -> set[str]:
        """The running simulations with a rank on any of ``nodes`` (whose speeds a change
        there alters)."""
        out: set[str] = set()
        for n in nodes:
            out |= self._running[n]
        return out

    # -- questions ---------------------------------------------------------------------------

    def fits(self, r: SimRank, target: RankResources) -> bool:
        node = self.node(r.node)
        others = self.requested(node.name) - r.charged
        need = max(r.allocated.request_millis, target.request_millis)
        return others + need <= node.allocatable_millis

    def place(self, spec: SimSpec) -> list[str]:
        """Each rank's node: the controller's (``spec.rank_nodes``), else the pinned one,
        else the first that holds all, else rank by rank the one with the most free
        millicores (ties: the first). LaunchFailed for an unknown node."""
        if spec.rank_nodes:
            unknown = sorted(set(spec.rank_nodes) - set(self._by_name))
            if unknown or len(spec.rank_nodes) != len(spec.ranks):
                raise LaunchFailed(f"no node {', '.join(unknown)} in cluster {self._name}")
            return list(spec.rank_nodes)
        pinned = spec.placement.get("node")
        if pinned is not None:
            if pinned not in self._by_name:
                raise LaunchFailed(f"no node {pinned} in cluster {self._name}")
            return [pinned] * len(spec.ranks)
        total = sum(r.request_millis for r in spec.ranks)
        for n in self.nodes:
            if n.allocatable_millis - self._requested[n.name] >= total:
                return [n.name] * len(spec.ranks)
        # most free first, ties to the earlier node: a heap of (-free, index)
        heap = [(-(n.allocatable_millis - self._requested[n.name]), i)
                for i, n in enumerate(self.nodes)]  # fmt: skip
        heapq.heapify(heap)
        out = []
        for res in spec.ranks:
            free, i = heapq.heappop(heap)
            out.append(self.nodes[i].name)
            heapq.heappush(heap, (free + res.request_millis, i))
        return out

    def timings(self) -> dict[str, Timing]:
        """Iteration timing of every running simulation at the current speeds (the same
        dict every call: read it, do not keep it)."""
        if self._dirty:
            stale: set[str] = set()
            for name in self._dirty:
                stale |= self._node_speeds(name)
            self._dirty.clear()
            for sim_id in stale:
                sim = self._sims.get(sim_id)
                if sim is None or sim.case is None:
                    continue
                rank_speeds = tuple(self._speeds.get((sim_id, r.index), 0.0) for r in sim.ranks)
                t = iteration_timing(sim.work_s, rank_speeds, sim.case.mpi_s_per_iteration)
                self._timings[sim_id] = Timing(t.iteration_s, t.duty, rank_speeds)
        return self._timings

    def _node_speeds(self, name: str) -> set[str]:
        """Share node ``name``'s cores among its running ranks; the simulations there."""
        node = self._by_name[name]
        members = [
            (sim_id, r)
            for sim_id in sorted(self._running[name])
            for r in self._sims[sim_id].ranks
            if r.node == name
        ]
        weights = [float(max(2, r.allocated.request_millis)) for _, r in members]
        caps = [min(1.0, (r.allocated.limit_millis or 1000) / 1000) for _, r in members]
        if node.reserved_millis > 0:
            weights.append(float(node.reserved_millis))
            caps.append(node.reserved_millis / 1000)
        shares = cpu_speeds(node.allocatable_millis / 1000, weights, caps)
        for (sim_id, r), share in zip(members, shares, strict=False):
            self._speeds[(sim_id, r.index)] = share
        return set(self._running[name])
