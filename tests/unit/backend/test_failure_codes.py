"""Failure codes where the local backend and the simulator see a run fail.

The local backend's codes come from mpirun's exit status (`backend.mpirun.exit_failure`,
`backend.local.observing.run_failure`): pure functions, tested without starting a process.
The simulator's come from its scenario (faults, stop, bad stage requests).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rankpack.backend.local.launching import LAUNCHER_NO_CGROUP, LAUNCHER_NO_RANK
from rankpack.backend.local.observing import run_failure
from rankpack.backend.mpirun import exit_failure
from rankpack.backend.protocol import RankResources, SimPhase, SimSpec, StageSpec
from rankpack.core.failures import FailureCode
from rankpack.testing.simcluster import SimulatedCluster
from rankpack.testing.simmodel import RankFault, SimNode, SimTiming, SimulatedCase
from rankpack.testing.simulated import SimulatedBackend

# --- mpirun's exit status (both real backends) ---------------------------------------------


@pytest.mark.parametrize(
    ("code", "stopped", "expected", "message"),
    [
        pytest.param(0, False, None, None, id="success"),
        pytest.param(1, False, FailureCode.SOLVER_FAILED, "the MPI job exited with code 1",
                     id="solver-error"),
        pytest.param(128, False, FailureCode.SOLVER_FAILED, "the MPI job exited with code 128",
                     id="highest-plain-code"),
        pytest.param(137, False, FailureCode.RANK_FAILED, "the MPI job exited with code 137",
                     id="rank-killed-by-sigkill"),
        pytest.param(-9, False, FailureCode.RANK_FAILED, "mpirun was killed by signal 9",
                     id="mpirun-killed"),
        pytest.param(None, False, FailureCode.OTHER, "ended with an unknown status",
                     id="unknown"),
        pytest.param(0, True, FailureCode.STOPPED, "stopped", id="stopped-after-success"),
        pytest.param(143, True, FailureCode.STOPPED, "stopped", id="stopped-by-sigterm"),
    ],
)  # fmt: skip
def test_exit_failure_maps_mpiruns_exit_to_a_code(
    code: int | None, stopped: bool, expected: FailureCode | None, message: str | None
) -> None:
    failure = exit_failure(code, stopped=stopped)
    if expected is None:
        assert failure is None
    else:
        assert failure is not None
        assert (failure.code, failure.message) == (expected, message)


# --- the local backend ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "stopped", "adopted", "expected"),
    [
        pytest.param(0, False, False, None, id="success"),
        pytest.param(None, False, True, None, id="adopted-ended-unknown-code-is-success"),
        pytest.param(None, True, True, FailureCode.STOPPED, id="adopted-stopped"),
        pytest.param(None, False, False, FailureCode.OTHER, id="own-mpirun-unknown-code"),
        pytest.param(LAUNCHER_NO_CGROUP, False, False, FailureCode.LAUNCH_FAILED,
                     id="rank-cannot-join-its-cgroup"),
        pytest.param(LAUNCHER_NO_RANK, False, False, FailureCode.LAUNCH_FAILED,
                     id="launcher-without-a-rank"),
        pytest.param(LAUNCHER_NO_CGROUP, True, False, FailureCode.STOPPED,
                     id="stopped-wins"),
        pytest.param(1, False, False, FailureCode.SOLVER_FAILED, id="solver-error"),
        pytest.param(137, False, False, FailureCode.RANK_FAILED, id="rank-killed"),
    ],
)  # fmt: skip
def test_run_failure_of_a_local_run(
    code: int | None, stopped: bool, adopted: bool, expected: FailureCode | None
) -> None:
    failure = run_failure(code, stopped=stopped, adopted=adopted)
    assert (failure.code if failure else None) == expected


def test_a_launcher_failure_keeps_mpiruns_message() -> None:
    failure = run_failure(LAUNCHER_NO_CGROUP, stopped=False, adopted=False)
    assert failure is not None and failure.message == "the MPI job exited with code 98"


# --- the simulator --------------------------------------------------------------------------

INSTANT = SimTiming(stage_s=0.0, start_s=0.0, resize_latency_s=0.0)


def _backend(fault: RankFault | None = None) -> SimulatedBackend:
    cluster = SimulatedCluster(
        nodes=(SimNode("n0", 4000),),
        cases=(SimulatedCase("c", 100, 100_000),),
        timing=INSTANT,
        create_run_dirs=False,
    )
    if fault is not None:
        cluster.add_fault(fault)
    return SimulatedBackend(cluster)


def _launch(b: SimulatedBackend, sim_id: str) -> None:
    b.stage(StageSpec(sim_id, "c", 2, Path("/nonexistent/runs")))
    staged = b.observe(sim_id).staged
    assert staged is not None
    ranks = (RankResources(1000), RankResources(1000))
    b.launch(SimSpec(sim_id, staged.run_dir, ("simpleFoam",), ranks, staged.log_path))


def test_simulator_a_rank_fault_is_rank_failed() -> None:
    b = _backend(RankFault("s", 1, at_s=2.0))
    _launch(b, "s")
    assert b.observe("s").failure is None
    b.wait(10.0)
    obs = b.observe("s")
    assert (obs.phase, obs.failure) == (SimPhase.FAILED, FailureCode.RANK_FAILED)


def test_simulator_a_stop_is_stopped_launched_or_not() -> None:
    b = _backend()
    _launch(b, "running")
    b.stage(StageSpec("staged", "c", 2, Path("/nonexistent/runs")))
    for sim_id in ("running", "staged"):
        b.stop(sim_id)
        obs = b.observe(sim_id)
        assert (obs.phase, obs.failure) == (SimPhase.FAILED, FailureCode.STOPPED)


def test_simulator_a_success_has_no_code() -> None:
    b = SimulatedBackend(
        SimulatedCluster(cases=(SimulatedCase("c", 100, 3),), timing=INSTANT,
                         create_run_dirs=False)
    )  # fmt: skip
    _launch(b, "s")
    b.wait(1000.0)
    obs = b.observe("s")
    assert (obs.phase, obs.failure) == (SimPhase.SUCCEEDED, None)


@pytest.mark.parametrize(
    ("case", "n_ranks", "expected"),
    [
        pytest.param("nope", 2, FailureCode.NOT_A_CASE, id="unknown-case"),
        pytest.param("c", 0, FailureCode.INVALID_SPEC, id="no-ranks"),
        pytest.param("c", 101, FailureCode.INVALID_SPEC, id="more-ranks-than-cells"),
    ],
)
def test_simulator_a_refused_stage_request_says_why(
    case: str, n_ranks: int, expected: FailureCode
) -> None:
    b = _backend()
    b.stage(StageSpec("s", case, n_ranks, Path("/nonexistent/runs")))
    obs = b.observe("s")
    assert (obs.phase, obs.failure) == (SimPhase.FAILED, expected)
    assert obs.stage_error == obs.reason


def test_simulator_a_run_directory_that_cannot_be_made_is_stage_failed(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    b = SimulatedBackend(SimulatedCluster(cases=(SimulatedCase("c", 100, 3),), timing=INSTANT))
    b.stage(StageSpec("s", "c", 2, blocker / "runs"))
    obs = b.observe("s")
    assert (obs.phase, obs.failure) == (SimPhase.FAILED, FailureCode.STAGE_FAILED)
