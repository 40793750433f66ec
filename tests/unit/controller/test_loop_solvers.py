"""The loop's solver allowlist (the operator's admission, issue 26): a case whose own
application is not allowed fails at launch, before any rank runs; an allowed one runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankpack.controller.jobs import OneJob
from rankpack.controller.loop import run_jobs
from rankpack.controller.tracked import LoopSettings
from rankpack.plan.submission import Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

CASE = SimulatedCase("box", cells=8000, iterations=20, cell_work_s=1e-4)


@pytest.mark.parametrize(
    ("allowed", "status"),
    [(None, "completed"), (frozenset({CASE.solver}), "completed"), (frozenset({"x"}), "failed")],
)
def test_the_cases_application_must_be_allowed(
    tmp_path: Path, allowed: frozenset[str] | None, status: str
) -> None:
    backend = SimulatedBackend(SimulatedCluster(nodes=(SimNode("n", 2000),), cases=(CASE,)))
    launched: list[str] = []
    real_launch = backend.launch
    backend.launch = lambda spec: (launched.append(spec.sim_id), real_launch(spec))[1]  # type: ignore[method-assign]
    settings = LoopSettings(runs_root=tmp_path / "runs", solvers=allowed)
    sub = Submission(case="box", weights=(1.0, 1.0), budget_millis=1000, sizing="fixed")
    (result,) = run_jobs(backend, Store(tmp_path / "r.db"), OneJob(sub), settings).results
    assert result.status == status
    if status == "failed":
        assert result.message and "is not an allowed solver" in result.message
        assert launched == []
    else:
        assert len(launched) == 1
