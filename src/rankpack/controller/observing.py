"""The policy's view: `Observations` built from what the loop holds and the backend reports.

`Observer.observations` is the one builder of what `policy.decide` sees: every simulation
the loop holds (staging ones with their planned requests, launched ones as last observed),
the queue with each job's learned sizes (`rankpack.controller.learned`, or those of a
running copy the policy has sized), and the capacity left to this loop (the backend's
nodes, what others request there, the namespace's quota). The real loop and the dry run
(`rankpack.controller.loop.preview`) both use it, so both decide alike.

Its cost grows with what changed: a simulation's snapshot and its ranks' placement are
built again only when it was observed again (or its wait mode switched), learned sizes are
kept per submission until a run of the same case ends, and the running copies a queued job
could learn from are looked up by submission, not searched for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple, Protocol

from rankpack.backend.protocol import (
    BackendError,
    Inventory,
    NodeCapacity,
    Quota,
    RankBounds,
    SimObservation,
    SimPhase,
)
from rankpack.controller import waits
from rankpack.controller.decision import (
    NodeCores,
    Observations,
    QueuedSim,
    RankReading,
    RankSnapshot,
    SimSnapshot,
    StagedSim,
)
from rankpack.controller.jobs import Job
from rankpack.controller.learned import LearnedSizes, learnable, learned_sizes
from rankpack.controller.tracked import LoopContext, Tracked
from rankpack.core.actions import WaitSetting
from rankpack.errors import UserError
from rankpack.plan.allocation import Plan
from rankpack.plan.submission import Submission


class Capacity(NamedTuple):
    capacity_millis: int
    others_millis: int
    nodes: tuple[NodeCores, ...]
    bound: str
    """What binds the capacity when it is not the nodes (a ResourceQuota), else ''."""
    bounds: RankBounds | None = None
    """What a rank's request may be where ranks are placed (a LimitRange), None: anything."""


class AskedMillis(Protocol):
    def asked_millis(self, sim_id: str, rank: int) -> int | None:
        """The request last asked for a rank and not refused (None: none asked)."""
        ...


@dataclass(frozen=True)
class _Placed:
    """A launched simulation's ranks as last observed: per node, and in total."""

    last: SimObservation | None
    ranks: Mapping[str | None, int]
    millis: Mapping[str | None, int]
    total_millis: int
    limits_millis: int


class Observer:
    """Builds the policy's observations; keeps the learned sizes until a run of the same
    case ends."""

    def __init__(self, ctx: LoopContext, asked: AskedMillis | None = None) -> None:
        self.ctx = ctx
        self.asked = asked
        self.learned: dict[str, LearnedSizes | None] = {}
        """Learned sizes per submission (JSON key), until a run of its case ends."""
        self._keys: dict[Submission, str] = {}
        self._snapshots: dict[str, tuple[tuple[object, ...], SimSnapshot]] = {}
        self._placed: dict[str, _Placed] = {}
        self._nodes_cache: tuple[Inventory, tuple[NodeCores, ...], int] | None = None
        self._counted: dict[str, _Placed] = {}
        """Each launched simulation's ranks per node as counted in ``_ranks_on``."""
        self._ranks_on: dict[str | None, int] = {}
        self._millis_on: dict[str | None, int] = {}
        """This loop's ranks and requests per node (None: not placed), kept incrementally."""
        self._node_views: dict[str, tuple[NodeCapacity, NodeCores]] = {}
        """Each node's view and the capacity it was built from."""
        self._limited: dict[str, tuple[Plan, bool]] = {}
        self._copies: dict[str, list[Tracked]] | None = None
        """The held simulations by submission key, as of the last observations."""
        self._initial: dict[str, tuple[int, ...]] = {}
        """The queued submissions' initial requests (their plans) by key, kept while they
        wait."""
        self._seen: dict[int, tuple[Submission, str]] = {}
        """The keys of the submissions held or queued at the last observations, by
        identity (a submission of 64 ranks hashes its 64 weights: a microsecond a lookup,
        ~400 lookups a tick)."""

    def key(self, sub: Submission) -> str:
        """The submission's JSON key (what learned sizes and running copies are kept by)."""
        seen = self._seen.get(id(sub))
        if seen is not None and seen[0] is sub:
            return seen[1]
        key = self._keys.get(sub)  # by value: a queue may build its jobs again each tick
        if key is None:
            key = self._keys[sub] = json.dumps(sub.to_json(), sort_keys=True)
        self._seen[id(sub)] = (sub, key)
        return key

    def forget(self, sub: Submission) -> None:
        """A run of ``sub``'s case ended: what is learned of that case may have changed."""
        case = Path(sub.case).name
        for key in [k for k in self.learned if Path(json.loads(k)["case"]).name == case]:
            del self.learned[key]

    def placed(self, sim: Tracked) -> _Placed:
        """``sim``'s ranks per node and its requests, as last observed (cached)."""
        cached = self._placed.get(sim.sim_id)
        if cached is not None and cached.last is sim.last:
            return cached
        ranks: dict[str | None, int] = {}
        millis: dict[str | None, int] = {}
        limits = 0
        if sim.last is not None:
            for r in sim.last.ranks:
                ranks[r.node] = ranks.get(r.node, 0) + 1
                millis[r.node] = millis.get(r.node, 0) + r.request_millis
                limits += r.limit_millis or 0
            total = sum(millis.values())
        else:
            total = sim.plan.total_millis
            limits = sum(r.limit_millis or 0 for r in sim.plan.ranks)
        placed = _Placed(sim.last, ranks, millis, total, limits)
        self._placed[sim.sim_id] = placed
        return placed

    def ours_millis(self) -> int:
        """What the launched simulations request."""
        return sum(self.placed(s).total_millis for s in self.ctx.sims.values() if s.launched)

    def ours_limits_millis(self) -> int:
        """The CPU limits of the launched simulations' ranks (those that have one)."""
        return sum(self.placed(s).limits_millis for s in self.ctx.sims.values() if s.launched)

    def with_planned(self, nodes: tuple[NodeCores, ...]) -> tuple[NodeCores, ...]:
        """``nodes`` with this loop's ranks that the policy placed on them and whose pods
        are on no node yet (staging, or pending): counted as this loop's there, though
        the node does not report them yet."""
        ranks: dict[str, int] = {}
        millis: dict[str, int] = {}
        for s in self.ctx.sims.values():
            if not s.nodes or (s.last is not None and None not in self.placed(s).ranks):
                continue  # nothing placed by the policy, or every pod bound
            for node, m in planned_ranks(s):
                ranks[node] = ranks.get(node, 0) + 1
                millis[node] = millis.get(node, 0) + m
        if not ranks:
            return nodes
        return tuple(
            replace(n, ours_ranks=(n.ours_ranks or 0) + ranks[n.name],
                    ours_millis=(n.ours_millis or 0) + millis[n.name])
            if n.name in ranks else n
            for n in nodes
        )  # fmt: skip

    def capacity(self, limited: bool = False) -> Capacity:
        """The capacity left to this loop, what others request, the nodes as the wait rule
        sees them, and the namespace's quota when it is what binds. ``limited``: rank pods
        carry CPU limits equal to their requests (``--qos limits``), so a ``limits.cpu``
        quota binds their requests too."""
        ctx = self.ctx
        inventory = ctx.backend.inventory()
        ours = self.ours_millis()
        nodes, requested = self._nodes(inventory)
        nodes = self.with_planned(nodes)
        launched = sum(1 for s in ctx.sims.values() if s.launched)
        others = others_millis(requested, ours, launched, inventory.launch_overhead_millis)
        base = ctx.settings.capacity_millis or inventory.allocatable_millis
        if len(nodes) == 1 and ctx.settings.capacity_millis:
            # one node, capped for this loop (--allocatable): the cap is its cores
            nodes = (replace(nodes[0], allocatable_millis=min(base, nodes[0].allocatable_millis)),)
        # room for the next launch's own pods beside its ranks (a launcher pod): the ranks of
        # a plan that fills the capacity to the last millicore would not fit with it
        capacity = max(
            0, min(base, inventory.allocatable_millis - others) - inventory.launch_overhead_millis
        )
        bound = ""
        quotas: list[tuple[Quota, int]] = []
        if inventory.quota is not None:
            quotas.append((inventory.quota, ours))
        limited = limited or any(self._limits(s) for s in ctx.sims.values())
        if inventory.limits_quota is not None and limited:
            quotas.append((inventory.limits_quota, self.ours_limits_millis()))
        for quota, mine in quotas:
            # the namespace may request hard - (what its other pods request) more: Kubernetes
            # refuses a pod or a resize past it, so plan within it instead
            allowed = max(0, quota.hard_millis - max(0, quota.used_millis - mine))
            if allowed < capacity:
                capacity = allowed
                bound = (
                    f"the namespace's ResourceQuota {quota.name} ({quota.resource}"
                    f" {quota.hard_millis}m, {quota.used_millis}m used)"
                )
        return Capacity(capacity, others, nodes, bound, inventory.rank_bounds)

    def _nodes(self, inventory: Inventory) -> tuple[tuple[NodeCores, ...], int]:
        """The nodes as the policy sees them (what others and this loop request and run on
        each) and all that is requested on them. Incremental: the ranks per node are kept
        and changed only by the simulations observed again (or gone), and a node's view is
        built again only when its capacity (by identity) or this loop's ranks on it
        changed."""
        counted: dict[str, _Placed] = {
            s.sim_id: self.placed(s) for s in self.ctx.sims.values() if s.launched and s.last
        }
        dirty: set[str | None] = set()
        for sim_id, old in self._counted.items():
            if counted.get(sim_id) is not old:
                dirty |= self._count(old, -1)
        for sim_id, new in counted.items():
            if self._counted.get(sim_id) is not new:
                dirty |= self._count(new, +1)
        self._counted = counted
        cached = self._nodes_cache
        if cached is not None and cached[0] is inventory and not dirty:
            return cached[1], cached[2]
        views = []
        for n in inventory.nodes:
            known = self._node_views.get(n.name)
            if known is not None and known[0] is n and n.name not in dirty:
                views.append(known[1])
                continue
            ours, ours_millis = self._ranks_on.get(n.name, 0), self._millis_on.get(n.name, 0)
            view = NodeCores(
                n.name, n.allocatable_millis, max(0, n.rank_pods - ours),
                max(0, n.requested_millis - ours_millis), ours, ours_millis, n.rank_groups,
            )  # fmt: skip
            self._node_views[n.name] = (n, view)
            views.append(view)
        nodes = tuple(views)
        if cached is not None and cached[0] is inventory:
            requested = cached[2]
        else:
            requested = sum(n.requested_millis for n in inventory.nodes)
        self._nodes_cache = (inventory, nodes, requested)
        return nodes, requested

    def _count(self, placed: _Placed, sign: int) -> set[str | None]:
        """Add (or take away) a simulation's ranks per node; the nodes it touches."""
        for node, n in placed.ranks.items():
            self._ranks_on[node] = self._ranks_on.get(node, 0) + sign * n
        for node, m in placed.millis.items():
            self._millis_on[node] = self._millis_on.get(node, 0) + sign * m
        return set(placed.ranks) | set(placed.millis)

    def _limits(self, sim: Tracked) -> bool:
        """Some rank of its plan has a CPU limit (``--qos limits``)."""
        cached = self._limited.get(sim.sim_id)
        if cached is None or cached[0] is not sim.plan:
            cached = (sim.plan, any(r.limit_millis is not None for r in sim.plan.ranks))
            self._limited[sim.sim_id] = cached
        return cached[1]

    def observations(self, pending: list[Job], ahead: Mapping[int, str] = {}) -> Observations:
        """What `policy.decide` sees this tick: the simulations held, ``pending`` (the
        loop's queue, in order) and the capacity. ``ahead``: queue id -> the simulation
        its case is being staged ahead as (`Starter.prestaged`)."""
        return self._observations(pending, prune=True, ahead=ahead)

    def beside(self, sim_id: str) -> Observations:
        """What runs beside ``sim_id``, adopted (the wait rule for a simulation an earlier
        controller launched, `Starter.adopt`): the observations without a queue and it.
        The queue's plans are kept (the call is no news about the queue: dropping them
        planned every waiting job again on the next tick, ~0.1 ms each)."""
        obs = self._observations([], prune=False)
        return replace(obs, sims=tuple(s for s in obs.sims if s.sim_id != sim_id))

    def _staged_ahead(self, sim_id: str) -> tuple[bool, bool]:
        """(ready, failed) of a job staged ahead as ``sim_id`` (`QueuedSim.ready`); without
        ``launch_staged_only`` every job is ready (the gate stages it when it passes)."""
        if not self.ctx.settings.controller.launch_staged_only:
            return True, False
        if not sim_id:
            return False, False
        try:
            phase = self.ctx.backend.observe(sim_id).phase
        except BackendError:
            return False, True
        return phase is SimPhase.STAGED, phase is SimPhase.FAILED

    def _observations(
        self, pending: list[Job], *, prune: bool, ahead: Mapping[int, str] = {}
    ) -> Observations:
        now = self.ctx.now()
        live = self.ctx.sims
        for gone in [i for i in self._snapshots if i not in live]:
            del self._snapshots[gone]
            self._placed.pop(gone, None)
            self._limited.pop(gone, None)
        sims = [self._snapshot(sim, now) for sim in live.values()]
        self._copies = self._by_key()
        queued = []
        initials: dict[str, tuple[int, ...]] = {}
        for j in pending:
            found = self.learned_sizes(j.submission)
            initial = found.request_millis if found else self._initial_millis(j.submission)
            refused = self.ctx.requeued.get(j.queue_id)
            sim_id, wait = _ahead(j, ahead.get(j.queue_id, ""), self.ctx.settings.wait_mode)
            is_ready, failed = self._staged_ahead(sim_id)
            queued.append(QueuedSim(
                j.queue_id, j.submission.n_ranks, initial, found.duty if found else (),
                retry_at_s=refused.retry_at_s if refused else None,
                retry_reason=refused.reason if refused else "", ahead=sim_id, wait=wait,
                ready=is_ready, stage_failed=failed,
                mpi_yields=(j.submission.mpi or self.ctx.settings.mpi) == "openmpi",
            ))  # fmt: skip
            key = self.key(j.submission)
            if key in self._initial:
                initials[key] = self._initial[key]
        if prune:
            self._initial = initials  # kept only while its job waits
            held = {id(s.job.submission) for s in live.values()}
            held |= {id(j.submission) for j in pending}
            self._seen = {i: seen for i, seen in self._seen.items() if i in held}
        head_limited = any(j.submission.qos == "limits" for j in pending[:1])
        cap = self.capacity(limited=head_limited)
        bounds = cap.bounds
        ready = [s for s in live.values() if s.staged is not None and not s.launched]
        own = self.capacity().capacity_millis if ready and head_limited else cap.capacity_millis
        return Observations(
            now_s=now,
            capacity_millis=cap.capacity_millis,
            sims=tuple(sims),
            queue=tuple(queued),
            others_millis=cap.others_millis,
            nodes=cap.nodes,
            capacity_bound=cap.bound,
            rank_min_millis=bounds.min_millis if bounds else 0,
            rank_max_millis=bounds.max_millis if bounds else None,
            rank_bounds=bounds.source if bounds else "",
            staged=tuple(_staged(s, own) for s in ready),
        )

    def _initial_millis(self, sub: Submission) -> tuple[int, ...]:
        """``sub``'s initial requests, planned once while it waits (a plan of 64 ranks took
        ~0.5 ms: a queue of 200 cost ~50 ms a tick, `bench/scale.py`)."""
        key = self.key(sub)
        found = self._initial.get(key)
        if found is None:
            found = self._initial[key] = sub.initial_millis
        return found

    # -- learned sizes -------------------------------------------------------------------

    def _snapshot(self, sim: Tracked, now: float) -> SimSnapshot:
        """``sim``'s snapshot: the one built when it was last observed, unless it was
        observed again (or its wait mode or placement changed) since."""
        key = (sim.last, sim.wait_mode, sim.started_s, sim.staged)
        cached = self._snapshots.get(sim.sim_id)
        if cached is not None and sim.last is not None and _same(cached[0], key):
            return cached[1]
        snap = replace(_snapshot(sim), observed_s=now)
        self._snapshots[sim.sim_id] = (key, snap)
        return snap

    def learned_sizes(self, sub: Submission) -> LearnedSizes | None:
        key = self.key(sub)
        if key not in self.learned:
            c = self.ctx.settings.controller
            self.learned[key] = learned_sizes(
                self.ctx.store, sub, self.ctx.backend.name, headroom=c.headroom,
                floor_millis=c.floor_millis,
            )  # fmt: skip
        return self.learned[key] or self._running_copy(sub, key)

    def _running_copy(self, sub: Submission, key: str) -> LearnedSizes | None:
        """The sizes of a running copy of ``sub`` (same submission) that the policy has
        sized: copies queued together fit at once, before any of them has completed."""
        if not learnable(sub):
            return None
        copies = self._copies if self._copies is not None else self._by_key()
        for sim in copies.get(key, ()):
            mem = self.ctx.state.sims.get(sim.sim_id)
            if (
                sim.sim_id not in self.ctx.sims
                or sim.last is None
                or sim.run_id is None
                or mem is None
                or mem.stage != "sized"
                or len(mem.duty) != sub.n_ranks
                or len(sim.last.ranks) != sub.n_ranks
            ):
                continue
            millis = []
            for r in sim.last.ranks:
                asked = self.asked.asked_millis(sim.sim_id, r.rank) if self.asked else None
                millis.append(r.desired.request_millis if asked is None else asked)
            return LearnedSizes(sim.run_id, tuple(millis), "running", tuple(mem.duty))
        return None

    def _by_key(self) -> dict[str, list[Tracked]]:
        """The simulations this loop holds, by their submission's key, in order."""
        out: dict[str, list[Tracked]] = {}
        for sim in self.ctx.sims.values():
            out.setdefault(self.key(sim.job.submission), []).append(sim)
        return out

    def plan(self, sub: Submission) -> tuple[Plan, LearnedSizes | None]:
        """The submission's plan, its requests replaced by learned ones when there are any
        (the total stays the budget: it keys the single-run baselines)."""
        plan = sub.plan()
        found = self.learned_sizes(sub)
        if found is None or len(found.request_millis) != plan.n_ranks:
            return plan, None
        ranks = tuple(
            replace(r, cpu_millis=m) for r, m in zip(plan.ranks, found.request_millis, strict=True)
        )
        return replace(plan, ranks=ranks), found


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """The same observation (by identity: a new one is news) and the same other values."""
    return a[0] is b[0] and a[1:] == b[1:]


def planned_ranks(sim: Tracked) -> list[tuple[str, int]]:
    """(node, request) of each of ``sim``'s ranks that the policy placed on a node
    (`Tracked.nodes`) and whose pod is on no node yet (staging, or pending)."""
    if not sim.nodes:
        return []
    if sim.last is None:  # staging (or launched, not observed yet)
        return [(n, r.cpu_millis) for n, r in zip(sim.nodes, sim.plan.ranks, strict=False)]
    return [
        (n, r.request_millis)
        for n, r in zip(sim.nodes, sim.last.ranks, strict=False)
        if r.node is None
    ]


def _snapshot(sim: Tracked) -> SimSnapshot:
    sub = sim.job.submission
    planned = sim.nodes if len(sim.nodes) == len(sim.plan.ranks) else ()
    if sim.last is None:
        return SimSnapshot(
            sim_id=sim.sim_id,
            started_s=sim.queued_s,
            iterations=0,
            expected_iterations=sim.staged.expected_iterations if sim.staged else 0,
            budget_millis=sub.budget_millis,
            ranks=tuple(
                RankSnapshot(
                    r.rank, r.cpu_millis, 0, None, None, node=planned[i] if planned else None
                )
                for i, r in enumerate(sim.plan.ranks)
            ),
            phases=sub.phases,
            sizing=sub.sizing,
            starting=True,
            learned_duty=sim.learned_duty,
            wait=sim.wait_setting,
            launched=sim.launched,
        )
    assert sim.staged is not None
    ranks: tuple[RankReading, ...] = sim.last.ranks  # read as observed: nothing to add
    if planned and any(r.node is None for r in ranks):
        ranks = tuple(  # pods not bound yet: on the nodes the policy placed them
            RankSnapshot(
                rank=r.rank,
                request_millis=r.request_millis,
                usage_ns=r.usage_ns,
                compute_ns=r.compute_ns,
                mpi_ns=r.mpi_ns,
                node=r.node if r.node is not None else planned[i],
                pod=r.pod,
                readings_ok=r.readings_ok,
            )
            for i, r in enumerate(sim.last.ranks)
        )
    return SimSnapshot(
        sim_id=sim.sim_id,
        started_s=sim.started_s,
        iterations=sim.parser.state.iterations,
        expected_iterations=sim.staged.expected_iterations,
        budget_millis=sub.budget_millis,
        ranks=ranks,
        phases=sub.phases,
        sizing=sub.sizing,
        starting=sim.last.phase is SimPhase.PENDING,
        learned_duty=sim.learned_duty,
        wait=sim.wait_setting,
        wait_mode=sim.wait_mode,
        mpi_yields=sim.mpi_yields,
    )


def others_millis(requested: int, ours: int, launched: int, overhead: int) -> int:
    """What pods that are not this loop's request: the nodes' requests but this loop's ranks
    (``ours``) and the pods each of its ``launched`` simulations has beside them
    (``overhead`` each: `Inventory.launch_overhead_millis`, a launcher pod in pod mode).
    Counting a simulation's own launcher pod as another's made the capacity left to this
    loop smaller than the launch had fitted its ranks to (the launcher pod counted twice),
    and the wait rule then took its own ranks for crowded: polite until the first resize."""
    return max(0, requested - ours - launched * overhead)


def _staged(sim: Tracked, capacity_millis: int) -> StagedSim:
    """A staged simulation as its launch sees it (its launch's capacity: with its own CPU
    limits, which `Observer.capacity` counts for every simulation held)."""
    planned = sim.nodes if len(sim.nodes) == len(sim.plan.ranks) else ()
    return StagedSim(
        sim_id=sim.sim_id,
        queue_id=sim.job.queue_id,
        request_millis=tuple(r.cpu_millis for r in sim.plan.ranks),
        nodes=planned,
        wait=sim.wait_setting,
        capacity_millis=capacity_millis,
        mpi_yields=sim.mpi_yields,
    )


def _ahead(job: Job, sim_id: str, session_wait: str) -> tuple[str, WaitSetting]:
    """`QueuedSim.ahead` and its wait setting (for a job whose case is staged ahead)."""
    if not sim_id:
        return "", "spin"
    try:
        return sim_id, waits.setting(job.submission.wait, session_wait)
    except UserError:
        return "", "spin"  # refused when it is staged, as any job
