"""The policy's view: `Observations` built from what the loop holds and the backend reports.

`Observer.observations` is the one builder of what `policy.decide` sees: every simulation
the loop holds (staging ones with their planned requests, launched ones as last observed),
the queue with each job's learned sizes (`rankpack.controller.learned`, or those of a
running copy the policy has sized), and the capacity left to this loop (the backend's
nodes, what others request there, the namespace's quota). The real loop and the dry run
(`rankpack.controller.loop.preview`) both use it, so both decide alike.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import NamedTuple, Protocol

from rankpack.backend.protocol import Quota, RankBounds, SimPhase
from rankpack.controller.jobs import Job
from rankpack.controller.learned import LearnedSizes, learnable, learned_sizes
from rankpack.controller.observations import (
    NodeCores,
    Observations,
    QueuedSim,
    RankSnapshot,
    SimSnapshot,
)
from rankpack.controller.tracked import LoopContext, Tracked
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


class Observer:
    """Builds the policy's observations; keeps the learned sizes until a run ends."""

    def __init__(self, ctx: LoopContext, asked: AskedMillis | None = None) -> None:
        self.ctx = ctx
        self.asked = asked
        self.learned: dict[str, LearnedSizes | None] = {}
        """Learned sizes per submission (JSON key), until a run ends (new knowledge)."""

    def ours_millis(self, but: Tracked | None = None) -> int:
        """What the launched simulations (but one) request."""
        return sum(
            sum(r.request_millis for r in s.last.ranks) if s.last else s.plan.total_millis
            for s in self.ctx.sims.values()
            if s.launched and s is not but
        )

    def ours_limits_millis(self) -> int:
        """The CPU limits of the launched simulations' ranks (those that have one)."""
        return sum(
            r.limit_millis or 0
            for s in self.ctx.sims.values()
            if s.launched
            for r in (s.last.ranks if s.last else s.plan.ranks)
        )

    def capacity(self, limited: bool = False) -> Capacity:
        """The capacity left to this loop, what others request, the nodes as the wait rule
        sees them, and the namespace's quota when it is what binds. ``limited``: rank pods
        carry CPU limits equal to their requests (``--qos limits``), so a ``limits.cpu``
        quota binds their requests too."""
        ctx = self.ctx
        inventory = ctx.backend.inventory()
        ours = self.ours_millis()
        others = max(0, sum(n.requested_millis for n in inventory.nodes) - ours)
        base = ctx.settings.capacity_millis or inventory.allocatable_millis
        placed: dict[str | None, int] = {}
        placed_millis: dict[str | None, int] = {}
        for s in ctx.sims.values():
            for r in s.last.ranks if s.launched and s.last else ():
                placed[r.node] = placed.get(r.node, 0) + 1
                placed_millis[r.node] = placed_millis.get(r.node, 0) + r.request_millis
        nodes = tuple(
            NodeCores(
                n.name, n.allocatable_millis, max(0, n.rank_pods - placed.get(n.name, 0)),
                max(0, n.requested_millis - placed_millis.get(n.name, 0)),
            )
            for n in inventory.nodes
        )  # fmt: skip
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
        limited = limited or any(
            r.limit_millis is not None for s in ctx.sims.values() for r in s.plan.ranks
        )
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

    def observations(self, pending: list[Job]) -> Observations:
        sims = [_snapshot(sim) for sim in self.ctx.sims.values()]
        queued = []
        for j in pending:
            found = self.learned_sizes(j.submission)
            initial = found.request_millis if found else j.submission.initial_millis
            refused = self.ctx.requeued.get(j.queue_id)
            queued.append(QueuedSim(
                j.queue_id, j.submission.n_ranks, initial, found.duty if found else (),
                retry_at_s=refused.retry_at_s if refused else None,
                retry_reason=refused.reason if refused else "",
            ))  # fmt: skip
        cap = self.capacity(limited=any(j.submission.qos == "limits" for j in pending[:1]))
        bounds = cap.bounds
        return Observations(
            now_s=self.ctx.now(),
            capacity_millis=cap.capacity_millis,
            sims=tuple(sims),
            queue=tuple(queued),
            others_millis=cap.others_millis,
            nodes=cap.nodes,
            capacity_bound=cap.bound,
            rank_min_millis=bounds.min_millis if bounds else 0,
            rank_max_millis=bounds.max_millis if bounds else None,
            rank_bounds=bounds.source if bounds else "",
        )

    # -- learned sizes -------------------------------------------------------------------

    def learned_sizes(self, sub: Submission) -> LearnedSizes | None:
        key = json.dumps(sub.to_json(), sort_keys=True)
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
        for sim in self.ctx.sims.values():
            mem = self.ctx.state.sims.get(sim.sim_id)
            if (
                sim.last is None
                or sim.run_id is None
                or mem is None
                or mem.stage != "sized"
                or len(mem.duty) != sub.n_ranks
                or len(sim.last.ranks) != sub.n_ranks
                or json.dumps(sim.job.submission.to_json(), sort_keys=True) != key
            ):
                continue
            millis = []
            for r in sim.last.ranks:
                asked = self.asked.asked_millis(sim.sim_id, r.rank) if self.asked else None
                millis.append(r.desired.request_millis if asked is None else asked)
            return LearnedSizes(sim.run_id, tuple(millis), "running", tuple(mem.duty))
        return None

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


def _snapshot(sim: Tracked) -> SimSnapshot:
    sub = sim.job.submission
    if sim.last is None:
        return SimSnapshot(
            sim_id=sim.sim_id,
            started_s=sim.queued_s,
            iterations=0,
            expected_iterations=sim.staged.expected_iterations if sim.staged else 0,
            budget_millis=sub.budget_millis,
            ranks=tuple(RankSnapshot(r.rank, r.cpu_millis, 0, None, None) for r in sim.plan.ranks),
            phases=sub.phases,
            sizing=sub.sizing,
            starting=True,
            learned_duty=sim.learned_duty,
            wait=sim.wait_setting,
        )
    assert sim.staged is not None
    return SimSnapshot(
        sim_id=sim.sim_id,
        started_s=sim.started_s,
        iterations=sim.parser.state.iterations,
        expected_iterations=sim.staged.expected_iterations,
        budget_millis=sub.budget_millis,
        ranks=tuple(
            RankSnapshot(
                rank=r.rank,
                request_millis=r.request_millis,
                usage_ns=r.usage_ns,
                compute_ns=r.compute_ns,
                mpi_ns=r.mpi_ns,
                node=r.node,
                readings_ok=r.readings_ok,
            )
            for r in sim.last.ranks
        ),
        phases=sub.phases,
        sizing=sub.sizing,
        starting=sim.last.phase is SimPhase.PENDING,
        learned_duty=sim.learned_duty,
        wait=sim.wait_setting,
        wait_mode=sim.wait_mode,
    )
