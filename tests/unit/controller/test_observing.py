"""The observations' queue: each waiting job's initial requests are planned once while it
waits, not every tick (issue 29: a queue of 200 64-rank jobs cost ~50 ms a tick)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankpack.controller.jobs import Job
from rankpack.controller.loop import ControlLoop, LoopSettings, OneJob
from rankpack.plan.allocation import Plan
from rankpack.plan.submission import Submission
from rankpack.store import Store
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
