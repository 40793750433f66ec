"""A job that names its namespace (the operator serving several, issue 26 item 7): its
staging and its launch are asked in that namespace, its run directory goes below its own
runs root, and its ranks get its namespace's volume unless its submission names one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rankpack.backend.protocol import SimSpec, StageSpec
from rankpack.controller.jobs import Job, OneJob
from rankpack.controller.loop import run_jobs
from rankpack.controller.tracked import LoopSettings
from rankpack.plan.submission import Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import SimNode, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

CASE = SimulatedCase("box", cells=8000, iterations=20, cell_work_s=1e-4)
SUB = Submission(case="box", weights=(1.0, 1.0), budget_millis=1000, sizing="fixed")


@pytest.mark.parametrize(
    ("own_volume", "expected"), [(None, "pvc:runs:/b"), ("pvc:mine:/b/runs", "pvc:mine:/b/runs")]
)
def test_a_jobs_namespace_runs_root_and_volume_reach_the_backend(
    tmp_path: Path, own_volume: str | None, expected: str
) -> None:
    backend = SimulatedBackend(SimulatedCluster(nodes=(SimNode("n", 2000),), cases=(CASE,)))
    staged: list[StageSpec] = []
    launched: list[SimSpec] = []
    stage, launch = backend.stage, backend.launch
    backend.stage = lambda spec: (staged.append(spec), stage(spec))[1]  # type: ignore[method-assign]
    backend.launch = lambda spec: (launched.append(spec), launch(spec))[1]  # type: ignore[method-assign]
    source = OneJob(replace(SUB, volume=own_volume))
    source.job = Job(0, source.job.submission, namespace="team-b",
                     runs_root=tmp_path / "b" / "runs", volume="pvc:runs:/b")  # fmt: skip
    settings = LoopSettings(runs_root=tmp_path / "runs", volume="pvc:shared:/all")
    (result,) = run_jobs(backend, Store(tmp_path / "r.db"), source, settings).results
    assert result.status == "completed"
    ((st,), (sim,)) = staged, launched
    assert (st.namespace, st.runs_root) == ("team-b", tmp_path / "b" / "runs")
    assert (sim.namespace, sim.volume) == ("team-b", expected)


def test_a_job_without_a_namespace_is_staged_as_before(tmp_path: Path) -> None:
    backend = SimulatedBackend(SimulatedCluster(nodes=(SimNode("n", 2000),), cases=(CASE,)))
    staged: list[StageSpec] = []
    stage = backend.stage
    backend.stage = lambda spec: (staged.append(spec), stage(spec))[1]  # type: ignore[method-assign]
    settings = LoopSettings(runs_root=tmp_path / "runs")
    run_jobs(backend, Store(tmp_path / "r.db"), OneJob(SUB), settings)
    assert [(s.namespace, s.runs_root) for s in staged] == [(None, tmp_path / "runs")]
