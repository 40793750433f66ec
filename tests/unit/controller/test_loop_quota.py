"""The loop plans within the namespace's CPU quota (issue 26, item 5): a launch that does
not fit the quota waits with the reason ``quota`` instead of being sent to be refused, and
runs once the quota has room; nothing fails for quota (simulated backend, virtual time)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rankpack.backend.protocol import Inventory, Quota
from rankpack.controller.decision import ControllerSettings
from rankpack.controller.jobs import StoreQueue
from rankpack.controller.loop import run_jobs
from rankpack.controller.tracked import LoopSettings
from rankpack.plan.submission import Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

CASE = SimulatedCase("box", cells=8000, iterations=60, cell_work_s=1e-4)


class Quoted(SimulatedBackend):
    """The simulated cluster in a namespace with a ``requests.cpu`` quota of ``hard``."""

    def __init__(self, cluster: SimulatedCluster, hard: int) -> None:
        super().__init__(cluster)
        self.hard = hard
        self.peak = 0

    def inventory(self) -> Inventory:
        inv = super().inventory()
        used = sum(n.requested_millis for n in inv.nodes)
        self.peak = max(self.peak, used)
        return replace(inv, quota=Quota("q", self.hard, used))


@pytest.mark.parametrize("gate", ["duty", "limit"])
def test_launches_and_packs_stay_within_the_quota(tmp_path: Path, gate: str) -> None:
    backend = Quoted(SimulatedCluster(nodes=(SimNode("n", 4000),), cases=(CASE,)), hard=1200)
    store = Store(tmp_path / "r.db")
    sub = Submission(case="box", weights=(1.0, 1.0), budget_millis=1000, sizing="fixed")
    store.submit_many("box", 2, sub.to_json(), 2)
    settings = LoopSettings(
        runs_root=tmp_path / "runs",
        controller=ControllerSettings(max_concurrent=2, launch_cooldown_s=0.0, gate=gate,
                                      min_predicted_gain=-1.0, launch_must_fit=True),
    )  # fmt: skip
    result = run_jobs(backend, store, StoreQueue(store, None), settings)
    assert [r.status for r in result.results] == ["completed", "completed"]
    assert backend.peak <= 1200  # nothing was ever asked past the quota
    if gate == "duty":  # launches only what fits: the second waits for the quota
        assert result.max_concurrent_seen == 1
        held = [e for e in store.events() if e.kind == "launch-held"
                and e.detail["code"] != "measuring"]  # fmt: skip
        assert held and held[0].detail["code"] == "quota"
        assert "ResourceQuota q (requests.cpu 1200m" in held[0].detail["reason"]
    else:  # the limit gate packs both into the quota: requests shrink in place first
        assert result.max_concurrent_seen == 2 and result.resizes >= 1
