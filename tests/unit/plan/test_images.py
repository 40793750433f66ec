"""`rankpack.plan.images.mpi_refusal`: the MPI the case's solver links (as staging found it
in the image) against what the Simulation says."""

from __future__ import annotations

import pytest

from rankpack.case import staging
from rankpack.core.failures import FailureCode
from rankpack.plan.images import NO_MPI, mpi_refusal


@pytest.mark.parametrize(("declared", "linked"), [("openmpi", "openmpi"), ("mpich", "mpich"),
                                                  ("openmpi", None), ("mpich", None)])  # fmt: skip
def test_what_agrees_or_was_not_told_runs(declared: str, linked: str | None) -> None:
    assert mpi_refusal(declared, linked, "simpleFoam") is None


def test_the_other_family_is_a_mismatch_that_says_what_to_set() -> None:
    refusal = mpi_refusal("openmpi", "mpich", "mySolver")
    assert refusal is not None and refusal.code is FailureCode.MPI_MISMATCH
    assert refusal.message == (
        "'mySolver' (the case's application) links MPICH (libmpich.so.12 or libmpi.so.12), but "
        "the Simulation says mpi: openmpi; set spec.mpi to mpich (rankpack submit --mpi mpich)"
    )


@pytest.mark.parametrize("declared", ["openmpi", "mpich"])
def test_a_solver_linking_no_mpi_is_unsupported(declared: str) -> None:
    refusal = mpi_refusal(declared, NO_MPI, "serialTool")
    assert refusal is not None and refusal.code is FailureCode.UNSUPPORTED_MPI
    assert "'serialTool' (the case's application) links no MPI library" in refusal.message
    assert "\n" not in refusal.message


def test_staging_and_the_plan_name_no_mpi_alike() -> None:
    assert staging.NO_MPI == NO_MPI
