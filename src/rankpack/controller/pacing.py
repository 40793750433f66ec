"""Resize storms bounded: so many resizes a second over the cluster and per node (pure).

Part of the decision step (`rankpack.controller.policy.decide` calls `pace` last). Every
rule of a step (sizing, phases, fairness, a pack) emits the resizes it wants; on a cluster
of a thousand simulations they come in storms: each sized simulation resizes all its ranks
at once, a pack resizes every running one. Each resize is a patch to the apiserver and a
change the kubelet of its node applies, so the step sends at most what two buckets allow:

* over the cluster, ``resize_rate_per_s`` a second (at most ``resize_burst`` at once);
* per node, ``resize_rate_per_node_s`` a second (at most ``resize_node_burst`` at once);
  a rank not placed yet counts over the cluster only.

Decreases go first (oldest first), then increases (oldest first): a decrease frees what an
increase on its node may need, and the loop holds an increase while a decrease is in
flight on its node (`rankpack.controller.resizes`). What does not fit waits in
``ControllerState.resize_queue`` for the next steps: a newer decision for the same rank
replaces it, and it is dropped when its simulation ends or the rank already has the
request. Until it is sent the step counts a waiting resize as decided (the rules see its
target) but the capacity as if it were not: a waiting decrease frees nothing yet and a
waiting increase holds its room (`Step.queued`). With the defaults no step of a node of
tens of ranks is ever paced: the resizes are sent as the rules emit them.

A node's capacity bounds its grows too (issue 28): on a cluster of several nodes an
increase that its rank's node cannot hold (its allocatable, less what other pods and this
loop's ranks there request, after the decreases sent before it) is not sent: MPI ranks
cannot move, and the node would defer it or refuse it. It waits in the same queue until
the node has room (a rank there shrinks or ends), and a ``resize-held`` note with the code
``node-full`` says so once, when it is decided.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from rankpack.controller.decision import ControllerSettings, ControllerState
from rankpack.controller.step import Step
from rankpack.core.actions import Note, Resize


@dataclass
class Pacer:
    """The buckets of one step: how many resizes it may still send, overall and per node."""

    settings: ControllerSettings
    now_s: float
    overall: float
    nodes: dict[str, float] = field(default_factory=dict)
    """Per node with a bucket not full: what it may still send."""

    @classmethod
    def of(cls, state: ControllerState, now_s: float, settings: ControllerSettings) -> Pacer:
        s = settings
        overall = _refill(state.resize_bucket, now_s, s.resize_rate_per_s, s.resize_burst)
        nodes = {
            node: _refill(b, now_s, s.resize_rate_per_node_s, s.resize_node_burst)
            for node, b in state.resize_node_buckets.items()
        }
        return cls(settings, now_s, overall, nodes)

    def left(self, node: str | None) -> float:
        here = self.nodes.get(node, float(self.settings.resize_node_burst)) if node else None
        return self.overall if here is None else min(self.overall, here)

    def allows(self, per_node: Mapping[str | None, int]) -> bool:
        """So many resizes (per node; None: not placed) may go out now."""
        total = sum(per_node.values())
        if total > self.overall + 1e-9:
            return False
        return all(node is None or n <= self.left(node) + 1e-9 for node, n in per_node.items())

    def take(self, node: str | None) -> bool:
        if self.left(node) < 1:
            return False
        self.overall -= 1
        if node:
            self.nodes[node] = self.nodes.get(node, float(self.settings.resize_node_burst)) - 1
        return True

    def buckets(self) -> tuple[tuple[float, float] | None, dict[str, tuple[float, float]]]:
        s = self.settings
        overall = None if self.overall >= s.resize_burst else (self.overall, self.now_s)
        nodes = {n: (v, self.now_s) for n, v in self.nodes.items() if v < s.resize_node_burst}
        return overall, nodes


def _refill(bucket: tuple[float, float] | None, now_s: float, rate: float, burst: int) -> float:
    if bucket is None:
        return float(burst)
    tokens, at_s = bucket
    return min(float(burst), tokens + max(0.0, now_s - at_s) * rate)


def pace(step: Step, state: ControllerState, pacer: Pacer) -> tuple[Resize, ...]:
    """Send what the buckets allow of the waiting resizes and this step's, decreases
    first; rewrite ``step.actions`` accordingly; return what still waits.

    Its cost grows with the resizes waiting and decided (each one's node and change are
    read once), not with the ranks: on a cluster of ten thousand ranks a sizing storm
    leaves about a thousand waiting, gone through every step."""
    new = [a for a in step.actions if isinstance(a, Resize)]
    fresh = {(a.sim_id, a.rank) for a in new}
    by_id = step.sims
    # each resize with its rank's node and its change, read once: the waiting ones (not
    # decided again in this step) first, then this step's
    facts: list[tuple[Resize, str | None, int]] = [
        (a, r.node, a.request_millis - r.request_millis)
        for a, r in zip(step.waiting, step.waiting_ranks, strict=True)
        if (a.sim_id, a.rank) not in fresh
    ]
    waiting = len(facts)
    for a in new:
        r = by_id[a.sim_id].ranks[a.rank]
        facts.append((a, r.node, a.request_millis - r.request_millis))
    grows = [a for a, _, change in facts if change > 0]
    room = None
    if grows and len(step.obs.nodes) > 1:
        room = node_room(step, {node for _, node, _ in facts})
    if not waiting and pacer.allows(per_node(new, step)) and _grows_fit(grows, room, step):
        for _, node, _ in facts:
            pacer.take(node)
        return ()

    latest: dict[tuple[str, int], tuple[Resize, str | None, int]] = {}
    for fact in facts:  # a rank's newest decision, in the order decided
        key = (fact[0].sim_id, fact[0].rank)
        latest.pop(key, None)
        latest[key] = fact
    ordered = [x for x in latest.values() if x[2] < 0]
    ordered += [x for x in latest.values() if x[2] >= 0]
    sent: list[Resize] = []
    queued: list[Resize] = []
    notes: list[Note] = []
    for a, node, grow in ordered:
        if room is not None and node in room and grow > max(0, room[node]):
            queued.append(a)
            if (a.sim_id, a.rank) in fresh:
                notes.append(_held(a, by_id[a.sim_id].ranks[a.rank].request_millis, node,
                                   room[node], step))  # fmt: skip
            continue
        if pacer.overall < 1:
            queued.append(a)  # the cluster's bucket is empty: no node's take can succeed
        elif pacer.take(node):
            sent.append(a)
            if room is not None and node in room:
                room[node] -= grow
        else:
            queued.append(a)
    first = next((i for i, a in enumerate(step.actions) if isinstance(a, Resize)), 0)
    others = [a for a in step.actions if not isinstance(a, Resize)]
    step.actions[:] = [*others[:first], *sent, *others[first:], *notes]
    return tuple(queued)


def node_room(step: Step, only: Collection[str | None] | None = None) -> dict[str, int]:
    """Per node: the millicores a grow there may take now (its allocatable less what other
    pods and this loop's ranks there request, as observed). ``only``: of these nodes (those
    the step's resizes are on; the others are not looked up), when the nodes count this
    loop's requests themselves."""
    obs = step.obs
    if only is not None and obs.counted_nodes:
        index = obs.node_index
        return {
            n.name: n.allocatable_millis - n.others_millis - (n.ours_millis or 0)
            for n in (index[name] for name in only if name is not None and name in index)
        }
    used = {n.name: n.ours_millis or 0 for n in obs.nodes}
    if not obs.counted_nodes:
        used = dict.fromkeys(used, 0)
        for sim in obs.sims:
            for r in sim.ranks:
                if r.node in used:
                    used[r.node] += r.request_millis
    return {n.name: n.allocatable_millis - n.others_millis - used[n.name] for n in obs.nodes}


def _grows_fit(grows: list[Resize], room: dict[str, int] | None, step: Step) -> bool:
    """Every grow of this step fits its node after the step's decreases there."""
    if room is None:
        return True
    left = dict(room)
    resizes = [a for a in step.actions if isinstance(a, Resize)]
    for a in resizes:
        node = _node(a, step)
        if node in left:
            left[node] -= a.request_millis - step.sims[a.sim_id].ranks[a.rank].request_millis
    return all(left.get(_node(a, step) or "", 0) >= 0 for a in grows if _node(a, step) in left)


def _held(a: Resize, had: int, node: str | None, free: int, step: Step) -> Note:
    cores = next((n.allocatable_millis for n in step.obs.nodes if n.name == node), 0)
    return Note(
        sim_id=a.sim_id,
        kind="resize-held",
        reason=(
            f"rank {a.rank}: {had}m -> {a.request_millis}m does not fit node {node} "
            f"({max(0, free)}m of its {cores}m unrequested; ranks cannot move): held until "
            "it has room"
        ),
        code="node-full",
    )


def _node(a: Resize, step: Step) -> str | None:
    sim = step.sims.get(a.sim_id)
    if sim is None or a.rank >= len(sim.ranks):
        return None
    return sim.ranks[a.rank].node


def per_node(actions: list[Resize], step: Step) -> dict[str | None, int]:
    """How many of ``actions`` resize a rank on each node (None: not placed)."""
    out: dict[str | None, int] = {}
    for a in actions:
        node = _node(a, step)
        out[node] = out.get(node, 0) + 1
    return out
