"""What a staged simulation launches with: its requests, its nodes, its wait mode (pure).

Part of the decision step: `rankpack.controller.policy.decide` calls `launches` first, for
every simulation whose case the loop found staged (`Observations.staged`, in that order),
and decides the rest of the step on the observations as they stand after those launches.
The loop applies each `Launch` as it is. Per simulation:

1. its plan's requests are brought within what the namespace allows a rank (a
   LimitRange's min and max, ``rank_min_millis``/``rank_max_millis``: a rank pod outside
   them is refused, and with it the gang); bounds no request satisfies are left to the
   backend, which refuses the launch with the reason;
2. on Kubernetes (``launch_must_fit``) they are scaled down to the unrequested capacity
   (`fit_launch`: rank pods that do not fit are never scheduled); the plan's total, the
   budget, stays;
3. the nodes the policy placed its ranks on when it staged them (`StageJob.nodes`) are
   checked again (its requests may have been fitted, others may have taken room
   meanwhile): kept while each node still holds its ranks, else placed again by the same
   rule (`room.place`), else none (the scheduler places the ranks);
4. its wait mode is the wait rule's among what runs beside it (`waits.at_launch`): under
   ``auto`` its ranks count with those already on the node(s), since spinning until the
   policy could switch it (its records publish ~1 s after launch) would cost the others.

A launch of this step counts for the next one's room and wait rule, as launched. A
simulation the gate stages in this step whose case was staged ahead and is ready
(`QueuedSim.ahead`) is launched in the same step, last (`ahead`): its launch does not wait
for the next tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rankpack.controller import waits
from rankpack.controller.decision import (
    ControllerSettings,
    NodeCores,
    Observations,
    RankSnapshot,
    SimSnapshot,
    StagedSim,
)
from rankpack.controller.room import place
from rankpack.core.actions import Launch, LaunchChange, StageJob
from rankpack.plan.allocation import proportional_millis


def launches(obs: Observations, settings: ControllerSettings) -> tuple[list[Launch], Observations]:
    """The launches of the staged simulations, and the observations with them launched."""
    out: list[Launch] = []
    for staged in obs.staged:
        launch = _launch(staged, obs, settings)
        out.append(launch)
        obs = _launched(obs, staged, launch)
    return out, replace(obs, staged=())


def ahead(
    obs: Observations, stages: Sequence[StageJob], settings: ControllerSettings
) -> list[Launch]:
    """The launches of the simulations this step stages whose case was staged ahead and is
    ready (`QueuedSim.ahead`): launched at once, each counted on its nodes as staged."""
    queued = {q.queue_id: q for q in obs.queue}
    out: list[Launch] = []
    for stage in stages:
        q = queued.get(stage.queue_id)
        if q is None or not q.ahead:
            continue
        requests = (
            stage.request_millis
            if len(stage.request_millis) == q.n_ranks
            else q.initial_request_millis
        )
        nodes = stage.nodes if len(stage.nodes) == q.n_ranks else ()
        staged = StagedSim(q.ahead, q.queue_id, requests, nodes, q.wait, obs.capacity_millis,
                           q.mpi_yields)  # fmt: skip
        view = replace(obs, nodes=_moved(obs.nodes, [], _planned(nodes, requests)))
        launch = _launch(staged, view, settings)
        out.append(launch)
        obs = replace(
            view,
            sims=(*view.sims, _snapshot(staged, launch)),
            nodes=_moved(view.nodes, _planned(nodes, requests),
                         _planned(launch.nodes, launch.request_millis)),
        )  # fmt: skip
    return out


def _launch(staged: StagedSim, obs: Observations, s: ControllerSettings) -> Launch:
    changes: list[LaunchChange] = []
    wanted = list(staged.request_millis)
    low, high = obs.rank_min_millis, obs.rank_max_millis
    empty = high is not None and low > high
    if not empty:
        bounded = [_clamp(m, low, high) for m in wanted]
        if bounded != wanted:
            why = f"requests {wanted} brought within {obs.rank_bounds}"
            changes.append(LaunchChange("launch-fitted", why, tuple(bounded)))
            wanted = bounded
    if s.launch_must_fit:
        ours = sum(sim.requested_millis for sim in obs.sims if sim.launched)
        free = staged.capacity_millis - ours
        floor = s.floor_millis if empty else _clamp(max(s.floor_millis, low), low, high)
        fitted = fit_launch(wanted, free, floor)
        if fitted is not None:
            changes.append(LaunchChange("launch-fitted", (
                f"requests {sum(wanted)}m scaled to the {free}m unrequested so that every "
                "rank pod fits"), tuple(fitted)))  # fmt: skip
            wanted = fitted
    nodes = _placed(staged, obs, wanted, changes)
    beside = replace(
        obs,
        sims=tuple(sim for sim in obs.sims if sim.sim_id != staged.sim_id),
        nodes=_moved(obs.nodes, _planned(staged.nodes, staged.request_millis),
                     _planned(nodes, wanted)),
    )  # fmt: skip
    choice = waits.at_launch(beside, staged.wait, wanted, nodes, staged.mpi_yields)
    return Launch(staged.sim_id, staged.queue_id, tuple(wanted), nodes, choice, tuple(changes))


def _clamp(millis: int, low: int, high: int | None) -> int:
    return max(low, min(millis, high if high is not None else millis))


def _placed(
    staged: StagedSim, obs: Observations, wanted: list[int], changes: list[LaunchChange]
) -> tuple[str, ...]:
    """Its nodes as placed when it was staged, if they still hold its ranks; else placed
    again, or none."""
    if not staged.nodes:
        return ()
    mine: dict[str, int] = {}
    for node, millis in zip(staged.nodes, staged.request_millis, strict=True):
        mine[node] = mine.get(node, 0) + millis
    free = [
        (n.name, n.allocatable_millis - n.others_millis - (n.ours_millis or 0)
         + mine.get(n.name, 0))
        for n in obs.nodes
    ]  # fmt: skip
    left = dict(free)
    for node, millis in zip(staged.nodes, wanted, strict=True):
        left[node] = left.get(node, 0) - millis
    if all(left.get(node, 0) >= 0 for node in set(staged.nodes)):
        return staged.nodes
    nodes = place(wanted, free) or ()
    changes.append(LaunchChange(
        "placement",
        f"placed on {', '.join(sorted(set(staged.nodes)))} at launch, where {sum(wanted)}m no "
        "longer fit: " + ("placed again" if nodes else "left to the scheduler"),
        nodes=nodes,
    ))  # fmt: skip
    return nodes


def _planned(nodes: Sequence[str], millis: Sequence[int]) -> list[tuple[str, int]]:
    return list(zip(nodes, millis, strict=False)) if nodes else []


def _moved(
    nodes: tuple[NodeCores, ...], before: list[tuple[str, int]], after: list[tuple[str, int]]
) -> tuple[NodeCores, ...]:
    """``nodes`` with a simulation's ranks counted on ``after`` (node, request) instead of
    ``before``."""
    if before == after:
        return nodes
    ranks: dict[str, int] = {}
    millis: dict[str, int] = {}
    for sign, planned in ((-1, before), (1, after)):
        for node, m in planned:
            ranks[node] = ranks.get(node, 0) + sign
            millis[node] = millis.get(node, 0) + sign * m
    return tuple(
        replace(n, ours_ranks=(n.ours_ranks or 0) + ranks[n.name],
                ours_millis=(n.ours_millis or 0) + millis[n.name])
        if n.name in ranks else n
        for n in nodes
    )  # fmt: skip


def _launched(obs: Observations, staged: StagedSim, launch: Launch) -> Observations:
    """``obs`` with ``staged`` launched as ``launch`` says (its snapshot's requests and nodes,
    the nodes' counts)."""
    return replace(
        obs,
        sims=tuple(
            replace(s, ranks=_ranks(launch), launched=True) if s.sim_id == staged.sim_id else s
            for s in obs.sims
        ),
        nodes=_moved(obs.nodes, _planned(staged.nodes, staged.request_millis),
                     _planned(launch.nodes, launch.request_millis)),
    )  # fmt: skip


def _ranks(launch: Launch) -> tuple[RankSnapshot, ...]:
    """A launched simulation's ranks before its first observation."""
    nodes = launch.nodes
    return tuple(
        RankSnapshot(i, m, 0, None, None, node=nodes[i] if nodes else None)
        for i, m in enumerate(launch.request_millis)
    )


def _snapshot(staged: StagedSim, launch: Launch) -> SimSnapshot:
    """A simulation launched from a case staged ahead, as the rest of the step sees it."""
    return SimSnapshot(
        sim_id=staged.sim_id, started_s=0.0, iterations=0, expected_iterations=0,
        budget_millis=sum(launch.request_millis), ranks=_ranks(launch), starting=True,
        wait=staged.wait,
    )  # fmt: skip


def fit_launch(wanted: Sequence[int], free_millis: int, floor_millis: int) -> list[int] | None:
    """The initial requests of a simulation about to launch scaled down to ``free_millis``
    (floors kept, in proportion), or None when they fit as they are or even the floors do
    not (then it launches as planned and waits to be scheduled)."""
    if sum(wanted) <= free_millis or free_millis < floor_millis * len(wanted):
        return None
    return proportional_millis([float(w) for w in wanted], free_millis, floor_millis)
