"""The staging sandbox's request and answer (`rankpack.case.stagewire`): what the operator
reads of a staged case is bounded and strict."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankpack.case import stagewire
from rankpack.case.staging import StagedCase, StageSpec
from rankpack.core.failures import FailureCode
from rankpack.plan.submission import SOLVER_PATTERN

RUN = Path("/var/lib/rankpack/runs/20261128-pitzDaily-2r")


def _staged(cells: tuple[int, ...] = (6122, 6103)) -> StagedCase:
    return StagedCase(run_dir=RUN, case_name="pitzDaily", case_source="/cases/pitzDaily",
                      solver="simpleFoam", cells_per_rank=cells, expected_iterations=200,
                      warnings=("w",))  # fmt: skip


def test_a_request_comes_back_as_the_spec_staged_in_place() -> None:
    spec = StageSpec("s1", "/cases/x", 2, Path("/runs"), iterations=50, decompose="weighted",
                     decompose_weights=(1.0, 3.0), center=(0.0, 1.0, 2.0), scan=False)  # fmt: skip
    back = stagewire.parse_request(stagewire.request_text(spec, RUN))
    assert (back.case, back.n_ranks, back.iterations, back.decompose) == ("/cases/x", 2, 50,
                                                                          "weighted")  # fmt: skip
    assert back.decompose_weights == (1.0, 3.0) and back.center == (0.0, 1.0, 2.0)
    assert back.workdir == RUN and back.in_place and back.confined and not back.scan


def test_a_staged_answer_round_trips() -> None:
    got = stagewire.parse_answer(stagewire.answer_text(_staged()), RUN, "/cases/x", 2)
    assert got == _staged()


@pytest.mark.parametrize("solver", ["simpleFoam", "rankloop-serial", "my.solver+2"])
def test_any_solver_a_simulation_may_name_round_trips(solver: str) -> None:
    """A program of the Simulation's image (``rankloop-serial``), not only an OpenFOAM
    application's name: the answer takes what the spec and the admission take."""
    staged = replace(_staged(), solver=solver)
    assert stagewire.parse_answer(stagewire.answer_text(staged), RUN, "/cases/x", 2) == staged
    assert stagewire.SOLVER_NAME.pattern == SOLVER_PATTERN


@pytest.mark.parametrize("mpi", ["openmpi", "mpich", "none", None])
def test_the_mpi_its_solver_links_round_trips(mpi: str | None) -> None:
    staged = replace(_staged(), mpi=mpi)
    text = stagewire.answer_text(staged)
    assert ('"mpi"' in text) is (mpi is not None)
    assert stagewire.parse_answer(text, RUN, "/cases/x", 2) == staged


@pytest.mark.parametrize("mpi", ["intelmpi", "", 7, ["openmpi"], "openmpi\u0000"])
def test_an_mpi_staging_cannot_say_is_refused(mpi: object) -> None:
    data = json.loads(stagewire.answer_text(_staged()))
    data["mpi"] = mpi
    with pytest.raises(stagewire.BadAnswer, match="mpi is not one of"):
        stagewire.parse_answer(json.dumps(data), RUN, "/cases/x", 2)


def test_a_failure_answer_keeps_its_code_and_is_cut() -> None:
    text = stagewire.failure_text("x" * 10_000, FailureCode.CASE_NOT_CONFINED)
    got = stagewire.parse_answer(text, RUN, "/cases/x", 2)
    assert isinstance(got, stagewire.SandboxFailure)
    assert got.code is FailureCode.CASE_NOT_CONFINED and len(got.error) == stagewire.TEXT_MAX


def test_a_failure_may_not_claim_a_code_staging_cannot_have() -> None:
    text = json.dumps({"ok": False, "error": "no", "code": "NodeLost"})
    got = stagewire.parse_answer(text, RUN, "/cases/x", 2)
    assert isinstance(got, stagewire.SandboxFailure) and got.code is FailureCode.STAGE_FAILED


@pytest.mark.parametrize(
    "answer",
    [
        "not json",
        "[]",
        "x" * 5000,
        json.dumps({"ok": True}),
        json.dumps({"ok": "yes"}),
        json.dumps(
            {
                "ok": True,
                "caseName": "a",
                "solver": "simpleFoam; rm -rf /",
                "cellsPerRank": [1, 2],
                "expectedIterations": 10,
            }
        ),
        json.dumps(
            {
                "ok": True,
                "caseName": "a",
                "solver": "simpleFoam",
                "cellsPerRank": [1, 2, 3],
                "expectedIterations": 10,
            }
        ),
        json.dumps(
            {
                "ok": True,
                "caseName": "a",
                "solver": "simpleFoam",
                "cellsPerRank": [1, -2],
                "expectedIterations": 10,
            }
        ),
        json.dumps(
            {
                "ok": True,
                "caseName": "a",
                "solver": "simpleFoam",
                "cellsPerRank": [1, 2],
                "expectedIterations": 10**12,
            }
        ),
        json.dumps(
            {
                "ok": True,
                "caseName": "a",
                "solver": "simpleFoam",
                "extra": 1,
                "cellsPerRank": [1, 2],
                "expectedIterations": 10,
            }
        ),
    ],
)
def test_an_answer_out_of_shape_is_refused(answer: str) -> None:
    with pytest.raises(stagewire.BadAnswer):
        stagewire.parse_answer(answer, RUN, "/cases/x", 2)


def test_a_few_hundred_ranks_fit_the_answer_itself_and_more_need_the_file() -> None:
    text = stagewire.answer_text(_staged(tuple([9_999_999_999] * 256)))
    assert len(text.encode()) <= stagewire.MESSAGE_MAX and "cellsPerRank" in text
    with pytest.raises(ValueError, match="over 4096 bytes"):
        stagewire.answer_text(_staged(tuple([9_999_999_999] * stagewire.MAX_RANKS)))


@given(st.text(max_size=6000))
def test_any_text_is_an_answer_or_refused_never_a_crash(text: str) -> None:
    with contextlib.suppress(stagewire.BadAnswer):
        stagewire.parse_answer(text, RUN, "/cases/x", 2)


def test_cells_of_many_ranks_go_to_a_file_the_answer_names(tmp_path: Path) -> None:
    cells = tuple(range(40_000, 40_000 + 4096))
    written: dict[str, str] = {}
    text = stagewire.answer_text(_staged(cells), write_cells=lambda t: written.update(f=t))
    assert len(text.encode()) <= stagewire.MESSAGE_MAX and "cellsPerRank" not in text
    got = stagewire.parse_answer(text, RUN, "/cases/x", 4096, read_cells=lambda _: written["f"])
    assert not isinstance(got, stagewire.SandboxFailure) and got.cells_per_rank == cells
    with pytest.raises(stagewire.BadAnswer):  # a file the operator was not told it may read
        stagewire.parse_answer(text, RUN, "/cases/x", 4096)
    with pytest.raises(stagewire.BadAnswer):  # a file that says other counts
        stagewire.parse_answer(text, RUN, "/cases/x", 4096, read_cells=lambda _: "[1, 2]")
    forged = text.replace(stagewire.CELLS_FILE, "../../operator.db")
    with pytest.raises(stagewire.BadAnswer):
        stagewire.parse_answer(forged, RUN, "/cases/x", 4096, read_cells=lambda _: written["f"])
