"""Failure codes in the loop (`rankpack.core.failures`): set where the failure is seen and
carried as data, never recovered from a message. On the simulated backend (virtual time)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from rankpack.backend.protocol import LaunchFailed, SimObservation, SimPhase, SimSpec, StageSpec
from rankpack.backend.worker import Stager
from rankpack.case.openfoam import NotACase
from rankpack.controller.jobs import OneJob
from rankpack.controller.loop import run_jobs
from rankpack.controller.tracked import LoopSettings
from rankpack.controller.views import Display, LoopResult, SimView
from rankpack.core.failures import FailureCode
from rankpack.plan.submission import Submission
from rankpack.store import Store
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import RankFault, SimNode, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

from ._helpers import Recorded

CASE = SimulatedCase("box", cells=8000, iterations=40, cell_work_s=1e-4)
SUB = Submission(case="box", weights=(1.0, 1.0), budget_millis=2000, sizing="fixed")


def _small_cluster() -> SimulatedCluster:
    return SimulatedCluster(nodes=(SimNode("node-a", 2000),), cases=(CASE,))


class Coded(SimulatedBackend):
    """A backend that says why a simulation failed with ``code`` (None: with no code)."""

    def __init__(self, cluster: SimulatedCluster, code: FailureCode | None) -> None:
        super().__init__(cluster)
        self.code = code

    def observe(self, sim_id: str) -> SimObservation:
        obs = super().observe(sim_id)
        return replace(obs, failure=self.code) if obs.phase is SimPhase.FAILED else obs


class KillOnce:
    """A display that kills rank 1 of the first launched simulation a few seconds in."""

    def __init__(self, cluster: SimulatedCluster, stop: threading.Event | None = None) -> None:
        self.cluster, self.stop, self.done = cluster, stop, False

    def update(self, now_s: float, sims: Sequence[SimView]) -> None:
        for sim in sims:
            if sim.run_id is not None and not self.done:
                self.cluster.add_fault(RankFault(sim.sim_id, 1, self.cluster.now + 3.0))
                self.done = True

    def close(self) -> None:
        pass


def _run_loop(
    tmp_path: Path,
    backend: SimulatedBackend,
    jobs: OneJob,
    display: Display | None = None,
    stop: threading.Event | None = None,
) -> LoopResult:
    settings = LoopSettings(runs_root=tmp_path / "runs")
    return run_jobs(backend, Store(tmp_path / "r.db"), jobs, settings, display=display, stop=stop)


def test_a_completed_run_has_no_failure_code(tmp_path: Path) -> None:
    (run,) = _run_loop(tmp_path, SimulatedBackend(_small_cluster()), OneJob(SUB)).results
    assert run.status == "completed" and run.failure is None


def test_a_failed_run_carries_the_backends_code(tmp_path: Path) -> None:
    cluster = _small_cluster()
    backend = Coded(cluster, FailureCode.OOM_KILLED)
    result = _run_loop(tmp_path, backend, OneJob(SUB), KillOnce(cluster))
    (run,) = result.results
    assert run.status == "failed" and run.failure == "OOMKilled"
    assert Store(tmp_path / "r.db").events()[-1].detail["code"] == "OOMKilled"


def test_a_failed_run_without_a_code_from_the_backend_is_other(tmp_path: Path) -> None:
    cluster = _small_cluster()
    (run,) = _run_loop(tmp_path, Coded(cluster, None), OneJob(SUB), KillOnce(cluster)).results
    # the message names the killed rank, but no code is recovered from its words
    assert run.status == "failed" and run.message and "rank 1 failed" in run.message
    assert run.failure == FailureCode.OTHER.value == "RunFailed"


def test_a_stopped_run_is_stopped(tmp_path: Path) -> None:
    stop = threading.Event()

    class StopAt5s:
        def update(self, now_s: float, sims: Sequence[SimView]) -> None:
            if now_s >= 5.0:
                stop.set()

        def close(self) -> None:
            pass

    result = _run_loop(tmp_path, SimulatedBackend(_small_cluster()), OneJob(SUB), StopAt5s(), stop)
    (run,) = result.results
    assert run.status == "interrupted" and run.failure == "Stopped"


def test_a_launch_the_backend_refuses_is_launch_failed(tmp_path: Path) -> None:
    backend = SimulatedBackend(_small_cluster())

    def refuse(spec: SimSpec) -> None:
        raise LaunchFailed("no rank pod could be created")

    backend.launch = refuse  # type: ignore[method-assign]  # a backend that refuses launches
    (run,) = _run_loop(tmp_path, backend, OneJob(SUB)).results
    assert run.status == "failed" and run.failure == "LaunchFailed"
    assert run.message == "launch failed: no rank pod could be created"


def test_a_solver_not_allowed_has_its_own_code(tmp_path: Path) -> None:
    settings = LoopSettings(runs_root=tmp_path / "runs", solvers=frozenset({"otherFoam"}))
    backend = SimulatedBackend(_small_cluster())
    (run,) = run_jobs(backend, Store(tmp_path / "r.db"), OneJob(SUB), settings).results
    assert run.status == "failed" and run.failure == "SolverNotAllowed"


@pytest.mark.parametrize(
    ("image", "status"),
    [(None, "completed"), ("team.example/cfd/foam:1", "failed"),
     ("team.example/other/foam:1", "completed")],
)  # fmt: skip
def test_an_image_the_admin_named_solvers_for_runs_only_those(
    tmp_path: Path, image: str | None, status: str
) -> None:
    """The case's application (simpleFoam) is in the default list; images under
    ``team.example/cfd`` may run only ``mySolver``."""
    only = (("team.example/cfd", frozenset({"mySolver"})),)
    settings = LoopSettings(runs_root=tmp_path / "runs", solvers=frozenset({"simpleFoam"}),
                            image_solvers=only)  # fmt: skip
    backend = SimulatedBackend(_small_cluster())
    job = OneJob(replace(SUB, image=image))
    (run,) = run_jobs(backend, Store(tmp_path / "r.db"), job, settings).results
    assert run.status == status, run.message
    if status == "failed":
        assert run.failure == "SolverNotAllowed"


MPI_CASES = [
    # submitted mpi, what its solver links, status, failure, the launch's mpi
    (None, "mpich", "completed", None, "mpich"),  # not said: what it links
    (None, None, "completed", None, "openmpi"),  # not told either: the session's
    ("openmpi", "openmpi", "completed", None, "openmpi"),
    ("openmpi", "mpich", "failed", "MPIMismatch", None),
    (None, "none", "failed", "UnsupportedMPI", None),
]  # fmt: skip


@pytest.mark.parametrize(("said", "linked", "status", "failure", "launched"), MPI_CASES)
def test_the_mpi_its_solver_links_decides_or_refuses(
    tmp_path: Path, said: str | None, linked: str | None, status: str, failure: str | None,
    launched: str | None,
) -> None:  # fmt: skip
    case = replace(CASE, mpi=linked)
    backend = SimulatedBackend(SimulatedCluster(nodes=(SimNode("node-a", 2000),), cases=(case,)))
    specs: list[SimSpec] = []
    launch = backend.launch

    def record(spec: SimSpec) -> None:
        specs.append(spec)
        launch(spec)

    backend.launch = record  # type: ignore[method-assign]
    settings = LoopSettings(runs_root=tmp_path / "runs", mpi="openmpi")
    job = OneJob(replace(SUB, mpi=said))
    (run,) = run_jobs(backend, Store(tmp_path / "r.db"), job, settings).results
    assert (run.status, run.failure) == (status, failure), run.message
    assert [s.mpi for s in specs] == ([launched] if launched else [])
    if failure == "MPIMismatch":
        assert "links MPICH" in run.message and "set spec.mpi to mpich" in run.message
    if failure == "UnsupportedMPI":
        assert "links no MPI library" in run.message


def test_a_case_that_cannot_be_staged_is_stage_failed(tmp_path: Path) -> None:
    jobs = Recorded(replace(SUB, case="nope"))
    result = _run_loop(tmp_path, Coded(_small_cluster(), None), jobs)  # a failure without a code
    (failed,) = result.stage_failures
    assert failed.failure is FailureCode.STAGE_FAILED and not result.results
    ((status, message, code),) = jobs.ends
    assert (status, code) == ("failed", FailureCode.STAGE_FAILED) and "nope" in message
    event = Store(tmp_path / "r.db").events()[-1]
    assert event.kind == "launch-failed" and event.detail["code"] == "StageFailed"


def test_the_backends_staging_code_is_kept(tmp_path: Path) -> None:
    jobs = Recorded(replace(SUB, case="nope"))
    result = _run_loop(tmp_path, Coded(_small_cluster(), FailureCode.NOT_A_CASE), jobs)
    assert result.stage_failures[0].failure is FailureCode.NOT_A_CASE
    assert jobs.ends[0][2] is FailureCode.NOT_A_CASE


def test_a_stage_refused_as_not_a_case_is_not_a_case(tmp_path: Path) -> None:
    backend = SimulatedBackend(_small_cluster())

    def refuse(spec: StageSpec) -> None:
        raise NotACase(f"{spec.case} is not an OpenFOAM case (no system/controlDict)")

    backend.stage = refuse  # type: ignore[method-assign]  # a backend that refuses the case
    jobs = Recorded(SUB)
    result = _run_loop(tmp_path, backend, jobs)
    assert result.stage_failures[0].failure is FailureCode.NOT_A_CASE
    assert jobs.ends == [("failed", result.stage_failures[0].reason, FailureCode.NOT_A_CASE)]


def test_the_staging_worker_codes_a_missing_case_as_not_a_case(tmp_path: Path) -> None:
    stager = Stager(lambda: None)
    spec = StageSpec(sim_id="s1", case=str(tmp_path / "missing"), n_ranks=2,
                     runs_root=tmp_path / "runs")  # fmt: skip
    stager.stage(spec)  # refused by the check, before any thread or directory
    obs = stager.observe("s1", 0.0)
    assert obs is not None and obs.phase is SimPhase.FAILED
    assert obs.failure is FailureCode.NOT_A_CASE and obs.stage_error
