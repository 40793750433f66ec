"""Where a launch may go: the unrequested CPU node by node, and which nodes are open (pure).

Part of the launch gate (`rankpack.controller.gate`): the *pipeline* launches a simulation
beside others still starting or being profiled when it fits capacity that none of them is
measured on. On a cluster of several nodes a node is **closed** to such a launch while

* a simulation launched less than ``launch_cooldown_s`` ago has a rank on it (a node takes
  at most one launch per cooldown: the per-node rate), or
* a simulation being measured (warm-up, profiling, or starting with no sizes known, or
  sized in this very step) has a rank on it that requests less than a core: such a rank
  borrows idle CPU beyond its request, which a newcomer would take, so its profiling
  window would measure the newcomer. A rank that requests a whole core cannot lose CPU to
  a launch that fits (CFS gives every rank at least its request when the requests fit the
  node), so a simulation measured on whole cores closes nothing.

An open node offers its unrequested millicores (allocatable minus what others and this
loop request there). Ranks not placed yet (a simulation staging, or pods not bound) take
their requests from the open total; a launch made in this step is placed, for the count,
the way the scheduler spreads pods: rank by rank on the open node with the most free
millicores (`take`); a simulation fits when each of its ranks finds such a node
(`fits`). The total never exceeds the capacity the step leaves (``Step.unrequested``: the
namespace's quota and the room kept for a launcher pod bind there).

Where a launch goes (`place`, issue 28): each rank of a simulation gets a node, decided
here and carried out by the backend (Kubernetes: a required node affinity, so the
scheduler's fit check still applies). A simulation spans nodes only when it must: one
node when one holds every rank (the one with the least room that does, so simulations
pack onto a node and whole nodes stay free for wide ones); else the fewest nodes, those
with the most room, its ranks balanced over them (each node keeps room for its ranks'
grows). The gate's own launch may go to any node, a pipelined one only to open nodes.

With one node (or no node list) there is no pipeline: the gate launches one simulation at
a time there, after everything running is measured, as it always did (its duty-cycle
model then knows every simulation it adds to, and a launch there shares the node with
all of them).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rankpack.controller.decision import SimMemory, SimSnapshot
from rankpack.controller.step import Step
from rankpack.core.actions import Resize

FULL_CORE_MILLIS = 1000
"""A rank that requests this much has a core of its own whatever its neighbours do."""


def measuring(sim: SimSnapshot, mem: SimMemory | None) -> bool:
    """Its duty cycles are being (or about to be) measured: warm-up, profiling, or starting
    with no sizes known (the gate's ``measuring``)."""
    stage = mem.stage if mem is not None else "warmup"
    return stage in ("warmup", "profiling") or (sim.starting and stage != "sized")


def borrows(sim: SimSnapshot, requests: Sequence[int]) -> bool:
    """Some rank requests less than a core: it may run on idle CPU beyond its request."""
    return any(r < FULL_CORE_MILLIS for r in requests) or not sim.ranks


@dataclass
class Room:
    """The open room of one step (see the module docstring)."""

    total_millis: int
    """The most every launch of this step may take together (the step's unrequested)."""
    unplaced_millis: int = 0
    """What ranks not placed yet request: they take it from the open nodes' room."""
    heap: list[tuple[int, int, str]] = field(default_factory=list)
    """Open nodes as (-free millicores, order, name): the most free first."""
    free: dict[str, int] = field(default_factory=dict)
    """Every node's unrequested millicores, open or closed, in the nodes' order: where
    this step's launches are placed (`place`)."""
    closed: dict[str, str] = field(default_factory=dict)
    """Closed nodes and why (``cooldown`` or ``measuring``)."""

    _frees: list[int] | None = field(default=None, init=False, repr=False, compare=False)
    """The open nodes' free millicores, most first (built on first use, dropped by `take`)."""
    _fits: dict[tuple[int, ...], bool] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """`fits` answers since the last `take` (a backfill asks the same for each of 32
    queued simulations of one shape)."""

    @property
    def open_millis(self) -> int:
        """What a launch may take now."""
        return max(0, min(self.total_millis, sum(self._sorted()) - self.unplaced_millis))

    def why_closed(self) -> str:
        """The reason that closes most nodes (``cooldown`` or ``measuring``); '' if none."""
        if not self.closed:
            return ""
        reasons = list(self.closed.values())
        return max(sorted(set(reasons)), key=reasons.count)

    def fits(self, requests: Sequence[int]) -> bool:
        """Each rank finds an open node, placed as `take` would place them. Only the
        ``len(requests)`` nodes with the most free can take one (a node not among them has
        no more free than any of them, and each rank touches one node), so the cost grows
        with the ranks, not the nodes."""
        key = tuple(sorted(requests, reverse=True))
        known = self._fits.get(key)
        if known is None:
            known = self._fits[key] = self._fits_now(key)
        return known

    def _fits_now(self, requests: tuple[int, ...]) -> bool:
        if sum(requests) > self.open_millis:
            return False
        heap = [-f for f in self._sorted()[: len(requests)]]
        heapq.heapify(heap)
        for r in requests:
            most = -heap[0] if heap else 0
            if most < r:
                return False
            heapq.heapreplace(heap, -(most - r))
        return True

    def _sorted(self) -> list[int]:
        if self._frees is None:
            self._frees = sorted((-f for f, _, _ in self.heap), reverse=True)
        return self._frees

    def take(self, requests: Sequence[int]) -> None:
        """A launch of this step takes ``requests`` (placed rank by rank on the open node
        with the most free millicores)."""
        self._frees = None
        self._fits.clear()
        self.total_millis -= sum(requests)
        for r in sorted(requests, reverse=True):
            if not self.heap:
                return
            free, order, name = self.heap[0]
            heapq.heapreplace(self.heap, (free + r, order, name))
            self.free[name] = -(free + r)

    def take_on(self, requests: Sequence[int], nodes: Sequence[str]) -> None:
        """A launch of this step takes ``requests`` on ``nodes`` (rank by rank, as `place`
        decided them)."""
        self.take(())  # (a take of nothing: resets what any change of the room resets)
        self.total_millis -= sum(requests)
        for r, name in zip(requests, nodes, strict=True):
            self.free[name] = self.free.get(name, 0) - r
        self.heap = [(-self.free[name], order, name) for _, order, name in self.heap]
        heapq.heapify(self.heap)

    def place(self, requests: Sequence[int], open_only: bool) -> tuple[str, ...] | None:
        """Each rank's node for a launch of ``requests`` (`place`), on the open nodes only
        or on any; None when they do not fit."""
        nodes = [(n, f) for n, f in self.free.items() if not (open_only and n in self.closed)]
        return place(requests, nodes)


def place(requests: Sequence[int], nodes: Sequence[tuple[str, int]]) -> tuple[str, ...] | None:
    """Each rank's node, for a simulation of ``requests`` (millicores per rank) on ``nodes``
    (name, unrequested millicores; in the nodes' order, which breaks ties); None when no
    placement is found (then the scheduler places the ranks).

    One node when one holds every rank: the one with the least room that does. Else the
    fewest nodes: the k with the most room (k from the least whose room adds up to the
    need, never more than the ranks), the largest rank first on the chosen node with the
    most room left (balanced), else first fit; then k + 1.
    """
    if not requests or not nodes:
        return None
    need = sum(requests)
    best: tuple[int, int, str] | None = None
    for order, (name, free) in enumerate(nodes):
        if free >= need and (best is None or free < best[0]):
            best = (free, order, name)
    if best is not None:
        return (best[2],) * len(requests)
    big = max(requests)
    useful = sorted(
        ((free, order, name) for order, (name, free) in enumerate(nodes) if free >= min(requests)),
        key=lambda n: (-n[0], n[1]),
    )
    if not useful or useful[0][0] < big or sum(f for f, _, _ in useful) < need:
        return None
    least, room = 0, 0
    while room < need:
        room += useful[least][0]
        least += 1
    largest = sorted(range(len(requests)), key=lambda i: (-requests[i], i))
    for k in range(max(2, least), min(len(useful), len(requests)) + 1):
        chosen = useful[:k]
        for spread in (True, False):
            found = _assign(requests, largest, chosen, spread)
            if found is not None:
                return found
    return None


def _assign(
    requests: Sequence[int],
    largest: Sequence[int],
    chosen: Sequence[tuple[int, int, str]],
    spread: bool,
) -> tuple[str, ...] | None:
    """Ranks (largest first) on ``chosen`` nodes: each on the one with the most room left
    (``spread``), else on the first that holds it; None if one fits none."""
    left = [f for f, _, _ in chosen]
    out = [""] * len(requests)
    for i in largest:
        if spread:
            j = max(range(len(left)), key=lambda j: (left[j], -j))
            if left[j] < requests[i]:
                return None
        else:
            j = next((j for j in range(len(left)) if left[j] >= requests[i]), -1)
            if j < 0:
                return None
        left[j] -= requests[i]
        out[i] = chosen[j][2]
    return tuple(out)


def build(step: Step, memory: Mapping[str, SimMemory], cooldown_s: float) -> Room:
    """The open room of ``step`` on a cluster of several nodes (``step.obs.nodes``). Its
    cost grows with the simulations that close nodes or were resized in this step when
    the nodes carry what this loop requests on them (`NodeCores.ours_millis`), else with
    every rank."""
    obs = step.obs
    total = max(0, step.unrequested())
    resized = {a.sim_id for a in step.actions if isinstance(a, Resize)}
    sized_now = {a.sim_id for a in step.actions if isinstance(a, Resize) and a.kind == "size"}
    names = {n.name for n in obs.nodes}
    counted = all(n.ours_millis is not None for n in obs.nodes)
    used: dict[str, int] = {n.name: n.ours_millis or 0 for n in obs.nodes} if counted else {}
    unplaced = 0
    closed: dict[str, str] = {}
    for sim in obs.sims:
        recent = obs.now_s - sim.started_s < cooldown_s
        blocks = sim.sim_id in sized_now or (
            measuring(sim, memory.get(sim.sim_id)) and borrows(sim, step.requests_of(sim))
        )
        odd = sim.unplaced > 0 or not sim.nodes <= names
        if counted and not (recent or blocks or odd or sim.sim_id in resized):
            continue  # placed as the nodes count it, and closes nothing
        requests = step.requests_of(sim)
        for rank, millis in zip(sim.ranks, requests, strict=True):
            node = rank.node
            if node is None or node not in names:
                unplaced += millis
                continue
            used[node] = used.get(node, 0) + (millis - rank.request_millis if counted else millis)
            if recent:
                closed.setdefault(node, "cooldown")
            elif blocks:
                closed[node] = "measuring"
    room = Room(total_millis=total, unplaced_millis=unplaced, closed=closed)
    for order, n in enumerate(obs.nodes):
        free = n.allocatable_millis - n.others_millis - used.get(n.name, 0)
        room.free[n.name] = free
        if n.name in closed:
            continue
        if free > 0:
            room.heap.append((-free, order, n.name))
    heapq.heapify(room.heap)
    return room
