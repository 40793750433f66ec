"""A launch refused for quota is undone and requeued, never failed (issue 26, item 5).

Another tenant can take the namespace's quota between the loop's plan and the backend's
create: the backend then deletes what it created and raises `LaunchRefused`. The loop
releases the staged copy, marks the run row ``requeued``, hands the job back to its source
and launches it again after a back-off, once there is room. On the simulated backend
(virtual time); the backend refuses the first launches as the Kubernetes one would.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rankpack.backend.protocol import Inventory, LaunchRefused, RankBounds, SimSpec
from rankpack.controller.jobs import Job, OneJob, StoreQueue
from rankpack.controller.loop import run_jobs
from rankpack.core.failures import Failure, FailureCode
from rankpack.plan.submission import Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

from ._helpers import Recorded, quick_loop_settings

CASE = SimulatedCase("box", cells=8000, iterations=40, cell_work_s=1e-4)
SUB = Submission(case="box", weights=(1.0, 1.0), budget_millis=1000, sizing="fixed")


class TakenTwice(SimulatedBackend):
    """Another tenant takes the quota between plan and create, for the first ``refusals``
    launches: each is refused with nothing left (as the Kubernetes backend does)."""

    def __init__(self, refusals: int = 2, bounds: RankBounds | None = None) -> None:
        super().__init__(SimulatedCluster(nodes=(SimNode("n", 4000),), cases=(CASE,)))
        self.refusals = refusals
        self.bounds = bounds
        self.launches: list[tuple[float, SimSpec]] = []
        self.released: list[str] = []

    def inventory(self) -> Inventory:
        return replace(super().inventory(), rank_bounds=self.bounds)

    def launch(self, spec: SimSpec) -> None:
        self.launches.append((self.clock(), spec))
        if len(self.launches) <= self.refusals:
            raise LaunchRefused(
                f"cannot create the rank pods of {spec.sim_id}: Forbidden: exceeded quota: q, "
                "requested: requests.cpu=500m, used: requests.cpu=1, limited: requests.cpu=1200m"
            )
        super().launch(spec)

    def release(self, sim_id: str) -> None:
        self.released.append(sim_id)
        super().release(sim_id)


def test_run_waits_through_refused_launches_and_completes(tmp_path: Path) -> None:
    backend, jobs = TakenTwice(), Recorded(SUB)
    store = Store(tmp_path / "r.db")
    result = run_jobs(backend, store, jobs, quick_loop_settings(tmp_path))
    # nothing failed: the third launch ran to its end
    assert [r.status for r in result.results] == ["completed"]
    assert jobs.statuses == ["completed"] and not result.stage_failures
    assert [w.code for w in jobs.whys] == [FailureCode.QUOTA_EXCEEDED] * 2
    assert "exceeded quota: q" in jobs.whys[0].message
    # each refused launch's staged copy was released; every attempt is a new simulation
    refused = [spec.sim_id for _, spec in backend.launches[:2]]
    assert set(refused) <= set(backend.released)
    assert len({spec.sim_id for _, spec in backend.launches}) == 3
    # the back-off: 2 s, then 4 s, before the next attempt (virtual time)
    t = [when for when, _ in backend.launches]
    assert t[1] - t[0] >= 2.0 and t[2] - t[1] >= 4.0
    # the runs list tells the truth: two requeued attempts, one completed run
    runs = sorted(store.list_runs(10), key=lambda r: r.id)
    assert [r.status for r in runs] == ["requeued", "requeued", "completed"]
    assert runs[0].failure == "QuotaExceeded" and "back in the queue" in (runs[0].message or "")
    events = [e for e in store.events() if e.kind == "launch-requeued"]
    assert [(e.detail["code"], e.detail["attempt"], e.detail["delay_s"]) for e in events] == [
        ("QuotaExceeded", 1, 2.0),
        ("QuotaExceeded", 2, 4.0),
    ]
    held = [e for e in store.events() if e.kind == "launch-held"]
    assert held and held[0].detail["code"] == "quota"
    assert held[0].detail["queue_id"] == 0  # whose hold: the operator's Event names it
    assert not [e for e in store.events() if e.kind in ("launch-failed", "finished")
                and e.detail.get("status") == "failed"]  # fmt: skip


def test_the_store_queue_gets_the_entry_back_and_runs_it(tmp_path: Path) -> None:
    backend = TakenTwice(refusals=1)
    store = Store(tmp_path / "r.db")
    (qid,) = store.submit_many("box", 2, SUB.to_json(), 1)
    seen: list[tuple[str, int | None]] = []

    class Watched(StoreQueue):
        def requeued(self, job: Job, why: Failure) -> None:
            super().requeued(job, why)
            row = self.store.get_queue(job.queue_id)
            assert row is not None
            seen.append((row.status, row.run_id))

    result = run_jobs(backend, store, Watched(store, None), quick_loop_settings(tmp_path))
    assert [r.status for r in result.results] == ["completed"]
    assert seen == [("queued", None)]  # claimable again, its refused run unlinked
    row = store.get_queue(qid)
    assert row is not None and row.status == "completed"
    assert row.run_id == result.results[0].id


def test_initial_requests_are_brought_within_the_limit_range(tmp_path: Path) -> None:
    bounds = RankBounds(min_millis=100, max_millis=400, source="LimitRange lr (...)")
    backend = TakenTwice(refusals=0, bounds=bounds)
    sub = replace(SUB, weights=(1.0, 9.0))  # 100m and 900m of the 1000m budget
    store = Store(tmp_path / "r.db")
    run_jobs(backend, store, OneJob(sub), quick_loop_settings(tmp_path))
    ((_, spec),) = backend.launches
    assert [r.request_millis for r in spec.ranks] == [100, 400]
    (fitted,) = [e for e in store.events() if e.kind == "launch-fitted"]
    assert "brought within LimitRange lr" in fitted.detail["reason"]
