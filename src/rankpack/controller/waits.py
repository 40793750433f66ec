"""How ranks wait in MPI: the decision step's rule, from where every rank sits (pure).

A rank that waits in MPI by spinning keeps its core busy. That is free when every rank on
the node has a core to itself, and ruinous when ranks outnumber the node's cores: a
spinning rank then takes CPU time from the very rank it waits for. Open MPI decides this
by itself only when one ``mpirun`` sees several ranks on one host with fewer slots, so on
the local backend it yields, while on Kubernetes every rank pod is a one-slot host to
``mpirun`` and it never does: 4 ranks of 250m..1000m on 2 cores ran pitzDaily 75x slower
than the same ranks under one local ``mpirun`` (issue 24). So the rule is rankpack's, the
same on every backend:

* count the ranks placed on each node, of every simulation there (this loop's, including
  those still starting, and other rankpack rank pods the backend reports on it);
* a node is *oversubscribed* when its ranks x 1000m exceed its allocatable CPU;
* a simulation with ``wait="auto"`` waits ``polite`` when any of its ranks is on an
  oversubscribed node that others share (ranks of another simulation, or its own ranks in
  more than one cgroup), or when its requests exceed the capacity left to rankpack while
  pods that are not rankpack's request CPU there; else it ``spin``s: every rank has a
  core to itself, or the node's only ranks are its own in one rank group (decision 0012),
  where the MPI library's own idle yield hands a waiting rank's core to the peer it waits
  for (a polite wait, which sleeps after 1 ms, costs 1.13x on 4-rank pitzDaily alone
  against that yield: docs/benchmarks.md).

Ranks not placed yet (rank pods pending on a multi-node cluster) are not on any node: they
count against the cluster as a whole (all ranks against all cores). With one node, every
rank is on it, whatever the backend calls it.

`choose` gives the mode with one reason per rank, which the loop records (run JSON, the
Simulation status), and whether the MPI library's own idle yield is on: on wherever a rank
of the simulation shares its node's cores with more ranks than cores, or waits politely;
off only where every rank spins on a core of its own. `mpi_idle_env` sets it at launch, so
that behaviour does not depend on what ``mpirun`` believes about slots (a fixed ``--wait
spin`` on a crowded node still yields, as one local ``mpirun`` made it do by itself).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import get_args

from rankpack.controller.decision import NodeCores, Observations
from rankpack.core.actions import RankWait, WaitChoice, WaitMode, WaitSetting
from rankpack.errors import UserError

SETTINGS: tuple[WaitSetting, ...] = get_args(WaitSetting)
"""The wait settings, as `WaitSetting` names them."""

CLUSTER = ""
"""The key under which ranks without a node are counted: the whole cluster."""


@dataclass(frozen=True)
class NodeLoad:
    """The ranks on one node (or, under `CLUSTER`, on the whole cluster) and its CPUs."""

    node: str
    ranks: int
    cores_millis: int

    @property
    def oversubscribed(self) -> bool:
        return self.ranks * 1000 > self.cores_millis

    def describe(self) -> str:
        where = "the cluster" if self.node == CLUSTER else f"node {self.node}"
        return f"{self.ranks} ranks on the {self.cores_millis / 1000:g} cores of {where}"


def setting(own: str | None, session: str) -> WaitSetting:
    """A simulation's wait setting: its submission's own mode, else the session's."""
    mode = own or session
    for known in SETTINGS:
        if mode == known:
            return known
    raise UserError(f"unknown wait mode '{mode}'; use {', '.join(SETTINGS[:-1])} or {SETTINGS[-1]}")


def nodes_of(obs: Observations) -> tuple[NodeCores, ...]:
    if obs.nodes:
        return obs.nodes
    return (NodeCores(CLUSTER, obs.capacity_millis + obs.others_millis),)


def node_of(node: str | None, nodes: Sequence[NodeCores], known: Collection[str] = ()) -> str:
    """Where a rank counts: its node; with one node, that node; unplaced: the cluster.
    ``known``: the nodes' names, when the caller has them (a set: looked up, not searched)."""
    if len(nodes) == 1:
        return nodes[0].name
    if node is None or node not in (known or {n.name for n in nodes}):
        return CLUSTER
    return node


def node_loads(obs: Observations, launching: int = 0) -> Mapping[str, NodeLoad]:
    """Ranks per node of every simulation in ``obs`` (and other rankpack ranks there), plus
    ``launching`` ranks of a simulation about to start (not placed yet). On a cluster whose
    nodes carry this loop's ranks (`NodeCores.ours_ranks`) a node's load is built when it
    is looked up (`CountedLoads`: a step looks up the nodes of the simulations it decides
    on, not the thousand others)."""
    nodes = nodes_of(obs)
    if len(nodes) > 1:
        counted = CountedLoads.of(obs, nodes, launching)
        if counted is not None:
            return counted
    counts = {n.name: n.other_ranks for n in nodes}
    unplaced = node_of(None, nodes)
    counts[unplaced] = counts.get(unplaced, 0) + launching
    if len(nodes) == 1:
        counts[unplaced] += sum(len(sim.ranks) for sim in obs.sims)
    elif all(n.ours_ranks is not None for n in nodes):
        # as the observations counted them on each node; the others are on no known node
        placed = 0
        for n in nodes:
            counts[n.name] += n.ours_ranks or 0
            placed += n.ours_ranks or 0
        ours = sum(len(sim.ranks) for sim in obs.sims)
        counts[CLUSTER] = counts.get(CLUSTER, 0) + max(0, ours - placed)
    else:
        known = set(counts)
        for sim in obs.sims:
            for rank in sim.ranks:
                key = rank.node if rank.node in known and rank.node else CLUSTER
                counts[key] = counts.get(key, 0) + 1
    loads = {n.name: NodeLoad(n.name, counts[n.name], n.allocatable_millis) for n in nodes}
    if CLUSTER not in loads:
        # unplaced ranks compete for the cluster: all ranks against all cores
        loads[CLUSTER] = NodeLoad(
            CLUSTER, sum(counts.values()), sum(n.allocatable_millis for n in nodes)
        )
    return loads


class CountedLoads(Mapping[str, NodeLoad]):
    """`node_loads` of several nodes that count this loop's ranks themselves, each node's
    built when it is first looked up: the same loads as the dict `node_loads` builds
    otherwise (the nodes in their order, then `CLUSTER`: every rank against every core)."""

    def __init__(self, obs: Observations, nodes: Sequence[NodeCores], launching: int) -> None:
        self._obs, self._launching = obs, launching
        self._nodes = {n.name: n for n in nodes}
        self._built: dict[str, NodeLoad] = {}

    @classmethod
    def of(
        cls, obs: Observations, nodes: Sequence[NodeCores], launching: int
    ) -> CountedLoads | None:
        """The lazy loads, or None when a node does not count this loop's ranks (or is
        named like `CLUSTER`): then the loads are counted rank by rank."""
        if not all(n.ours_ranks is not None for n in nodes):
            return None
        loads = cls(obs, nodes, launching)
        return None if CLUSTER in loads._nodes else loads

    def __getitem__(self, name: str) -> NodeLoad:
        load = self._built.get(name)
        if load is None:
            load = self._built[name] = self._load(name)
        return load

    def _load(self, name: str) -> NodeLoad:
        if name != CLUSTER:
            n = self._nodes[name]
            return NodeLoad(name, n.other_ranks + (n.ours_ranks or 0), n.allocatable_millis)
        nodes = self._nodes.values()
        placed = sum(n.ours_ranks or 0 for n in nodes)
        ours = sum(len(sim.ranks) for sim in self._obs.sims)
        ranks = sum(n.other_ranks for n in nodes) + placed + self._launching
        return NodeLoad(
            CLUSTER, ranks + max(0, ours - placed), sum(n.allocatable_millis for n in nodes)
        )

    def __contains__(self, name: object) -> bool:
        return name == CLUSTER or name in self._nodes

    def __iter__(self) -> Iterator[str]:
        yield from self._nodes
        yield CLUSTER

    def __len__(self) -> int:
        return len(self._nodes) + 1


def grouped(
    ranks: Sequence[tuple[str | None, str | None]], nodes: Sequence[NodeCores],
    known: Collection[str] = (),
) -> dict[str, int]:  # fmt: skip
    """For one simulation's ranks as (node, pod) pairs: each node (as `node_of` names it)
    where all of its ranks there are in one pod (one cgroup: a rank group), and how many.
    A rank whose pod is not known yet keeps its node out."""
    pods: dict[str, set[str | None]] = {}
    counts: dict[str, int] = {}
    for node, pod in ranks:
        key = node_of(node, nodes, known)
        pods.setdefault(key, set()).add(pod)
        counts[key] = counts.get(key, 0) + 1
    return {n: c for n, c in counts.items() if len(pods[n]) == 1 and None not in pods[n]}


def _contended(load: NodeLoad, own_groups: Mapping[str, int]) -> bool:
    """An oversubscribed node where a spinning rank would take CPU from ranks its own
    yield cannot reach: anything but one rank group of this simulation alone there."""
    return load.oversubscribed and own_groups.get(load.node) != load.ranks


def mode(
    setting: WaitSetting,
    rank_nodes: Collection[str | None],
    loads: Mapping[str, NodeLoad],
    nodes: Sequence[NodeCores],
    crowded_by_others: str = "",
    own_groups: Mapping[str, int] | None = None,
) -> WaitMode:
    """`choose`'s mode alone, without a reason per rank (what the policy compares with the
    mode a simulation has: the reasons are built only for a switch)."""
    if setting != "auto":
        return setting
    for n in set(rank_nodes):
        if _contended(loads[node_of(n, nodes, loads)], own_groups or {}):
            return "polite"
    return "polite" if crowded_by_others else "spin"


def choose(
    setting: WaitSetting,
    rank_nodes: Sequence[str | None],
    loads: Mapping[str, NodeLoad],
    nodes: Sequence[NodeCores],
    crowded_by_others: str = "",
    own_groups: Mapping[str, int] | None = None,
) -> WaitChoice:
    """The mode of one simulation whose ranks sit on ``rank_nodes`` (None: not placed).

    ``crowded_by_others``: non-empty (the reason) when pods that are not rankpack's take
    CPU the simulation's requests need; it then waits politely wherever its ranks are.
    ``own_groups``: `grouped` of its ranks (empty: none known to share a cgroup)."""
    where = [node_of(n, nodes, loads) for n in rank_nodes]
    placed = [loads[w] for w in where]
    crowded = [load for load in dict.fromkeys(placed) if load.oversubscribed]
    contended = [load for load in crowded if _contended(load, own_groups or {})]
    mode: WaitMode
    if setting != "auto":
        mode, why = setting, f"--wait {setting} (fixed)"
    elif contended:
        mode = "polite"
        why = "ranks outnumber cores: " + "; ".join(load.describe() for load in contended)
    elif crowded_by_others:
        mode, why = "polite", crowded_by_others
    elif crowded:
        mode = "spin"
        why = "its own ranks outnumber cores, in one cgroup (the MPI library yields): " + (
            "; ".join(load.describe() for load in crowded)
        )
    else:
        mode = "spin"
        why = "every rank has a core to itself: " + "; ".join(
            load.describe() for load in dict.fromkeys(placed)
        )
    ranks = tuple(
        RankWait(
            rank=i,
            node=given or w or None,
            mode=mode,
            why=load.describe() + (" (oversubscribed)" if load.oversubscribed else ""),
        )
        for i, (given, w, load) in enumerate(zip(rank_nodes, where, placed, strict=True))
    )
    return WaitChoice(mode, why, ranks, idle_yield=mode != "spin" or bool(crowded))


def others_crowd(obs: Observations, requested_millis: int) -> str:
    """Why pods that are not rankpack's crowd this loop's ranks ('' when they do not)."""
    if requested_millis > obs.capacity_millis and obs.others_millis > 0:
        return (
            f"requests {requested_millis}m exceed the {obs.capacity_millis}m of capacity left"
            f" to rankpack (others request {obs.others_millis}m of the node)"
        )
    return ""


def at_launch(
    obs: Observations, setting: WaitSetting, requests: Sequence[int], nodes: Sequence[str] = (),
    mpi_yields: bool = False,
) -> WaitChoice:  # fmt: skip
    """The mode a simulation about to start gets (``obs`` holds the simulations already
    there). ``nodes``: each rank's node where the policy placed them (`StageJob.nodes`), which
    ``obs.nodes`` count already; empty: not placed yet, they count against the cluster.
    ``mpi_yields``: its MPI library yields while idle; its ranks on a node whose backend
    runs them in one cgroup (`NodeCores.rank_groups`) then count as one rank group of its
    own there. Placement then refines it live (policy step E)."""
    requested = sum(s.requested_millis for s in obs.sims) + sum(requests)
    placed = len(nodes) == len(requests) and all(n.ours_ranks is not None for n in obs.nodes)
    rank_nodes: list[str | None] = list(nodes) if placed else [None] * len(requests)
    all_nodes = nodes_of(obs)
    grouping = {n.name for n in all_nodes if n.rank_groups} if mpi_yields else set()
    own: dict[str, int] = {}
    for node in rank_nodes:
        key = node_of(node, all_nodes)
        if key in grouping:
            own[key] = own.get(key, 0) + 1
    return choose(
        setting,
        rank_nodes,
        node_loads(obs, launching=0 if placed else len(requests)),
        all_nodes,
        others_crowd(obs, requested),
        own,
    )


def mpi_idle_env(idle_yield: bool) -> dict[str, str]:
    """The MPI libraries' own idle-yield settings (`WaitChoice.idle_yield`), for every rank.

    Open MPI reads ``mpi_yield_when_idle`` once, at ``MPI_Init``; ``mpirun`` sets it to 1 by
    itself only when it sees more ranks than slots on one host, and never overrides a value
    given in the environment. So: 0 where ranks spin on cores of their own, 1 otherwise. A
    later live switch (the shim's control word) changes how the shim waits; the library's
    setting stays as launched (a yield with no one else to run returns at once).
    MPICH's ``MPIR_CVAR_POLLS_BEFORE_YIELD`` (0: never yield) belongs to its ch3 device;
    Debian's MPICH 4.0.2 is ch4:ucx, which has no idle yield: there only the shim's polite
    mode yields (docs/shim.md)."""
    return {
        "OMPI_MCA_mpi_yield_when_idle": "1" if idle_yield else "0",
        "MPIR_CVAR_POLLS_BEFORE_YIELD": "1000" if idle_yield else "0",
    }
