"""What the observations cost (issue 29): each waiting job's initial requests are planned
once while it waits, not every tick (a queue of 200 64-rank jobs cost ~50 ms a tick), and
the nodes' view is kept incrementally, always what a count from scratch gives."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rankpack.backend.protocol import Inventory
from rankpack.controller.decision import ControllerSettings, NodeCores
from rankpack.controller.jobs import Job, OneJob, StoreQueue
from rankpack.controller.loop import ControlLoop, run_jobs
from rankpack.controller.observing import Observer
from rankpack.controller.tracked import LoopSettings
from rankpack.plan.allocation import Plan
from rankpack.plan.submission import Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimTiming, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend


def test_a_waiting_jobs_plan_is_made_once_and_forgotten_when_it_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    subs = [
        Submission(case="box", weights=(1.0, 3.0), budget_millis=1000),
        Submission(case="box", weights=(1.0,) * 3, budget_millis=3000, floor_millis=100),
    ]
    jobs = [Job(i + 1, sub) for i, sub in enumerate(subs)]
    expected = [sub.initial_millis for sub in subs]
    store = Store(tmp_path / "r.db")
    loop = ControlLoop(SimulatedBackend(), store, OneJob(subs[0]),
                       LoopSettings(runs_root=tmp_path / "runs"))  # fmt: skip
    planned: list[Submission] = []
    plan = Submission.plan

    def counted(self: Submission) -> Plan:
        planned.append(self)
        return plan(self)

    monkeypatch.setattr(Submission, "plan", counted)
    for _ in range(3):
        obs = loop.observer.observations(jobs)
        assert [q.initial_request_millis for q in obs.queue] == expected
    assert planned == subs  # once each, not once a tick
    obs = loop.observer.observations(jobs[1:])  # the first one left the queue
    assert [q.initial_request_millis for q in obs.queue] == expected[1:]
    obs = loop.observer.observations(jobs)  # queued again: planned again
    assert [q.initial_request_millis for q in obs.queue] == expected
    assert planned == [*subs, subs[0]]
    loop.observer.beside("s-launching")  # the wait rule at a launch: no news of the queue
    obs = loop.observer.observations(jobs)
    assert [q.initial_request_millis for q in obs.queue] == expected
    assert planned == [*subs, subs[0]]  # not planned again after it


def test_the_nodes_view_kept_incrementally_is_what_a_count_from_scratch_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8 simulations of 2-5 ranks on 3 nodes, some beside each other, starting and ending:
    # every nodes view the loop builds is checked against one counted from scratch
    case = SimulatedCase("box", cells=8000, iterations=30, cell_work_s=5e-4)
    cluster = SimulatedCluster(
        nodes=tuple(SimNode(f"n{i}", 4000, reserved_millis=250 * i) for i in range(3)),
        cases=(case,), timing=SimTiming(stage_s=0.5, start_s=1.0, resize_latency_s=0.5),
    )  # fmt: skip
    store = Store(tmp_path / "r.db")
    for ranks in (2, 5, 3, 4, 2, 5, 3, 2):
        sub = Submission(case="box", weights=(1.0,) * ranks, budget_millis=700 * ranks)
        store.submit_many("box", ranks, sub.to_json(), 1)
    settings = LoopSettings(
        runs_root=tmp_path / "runs", shim=True,
        controller=ControllerSettings(max_concurrent=8, launch_cooldown_s=0.0,
                                      min_predicted_gain=-1.0, launch_must_fit=True),
    )  # fmt: skip
    built = Observer._nodes
    checked: list[int] = []

    def checked_nodes(self: Observer, inventory: Inventory) -> tuple[tuple[NodeCores, ...], int]:
        nodes, requested = built(self, inventory)
        ranks: Counter[str | None] = Counter()
        millis: Counter[str | None] = Counter()
        for s in self.ctx.sims.values():
            if s.launched and s.last:
                for r in s.last.ranks:
                    ranks[r.node] += 1
                    millis[r.node] += r.request_millis
        assert nodes == tuple(
            NodeCores(n.name, n.allocatable_millis, max(0, n.rank_pods - ranks[n.name]),
                      max(0, n.requested_millis - millis[n.name]), ranks[n.name],
                      millis[n.name])
            for n in inventory.nodes
        )  # fmt: skip
        assert requested == sum(n.requested_millis for n in inventory.nodes)
        checked.append(sum(ranks.values()))
        return nodes, requested

    monkeypatch.setattr(Observer, "_nodes", checked_nodes)
    result = run_jobs(SimulatedBackend(cluster), store, StoreQueue(store, None), settings)
    assert [r.status for r in result.results] == ["completed"] * 8
    assert result.max_concurrent_seen >= 3  # several at once, so nodes were shared
    assert max(checked) >= 6 and checked[-1] < max(checked)  # ranks came and went
