"""decompose_case and `rankpack decompose` without OpenFOAM: files, validation, rollback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rankpack.case import decomposition as D
from rankpack.cli import main
from rankpack.errors import UserError

from .meshgen import grid_mesh, write_case


def _case_files(case: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(case)): p.read_bytes() for p in sorted(case.rglob("*")) if p.is_file()
    }


@pytest.fixture
def case(tmp_path: Path) -> Path:
    return write_case(tmp_path / "case", grid_mesh(20, 10))


def test_writes_manual_dict_and_cell_decomposition(case: Path) -> None:
    result = D.decompose_case(case, 4, "weighted", [1, 1, 5, 15], run_decompose_par=False)
    assert [r.cells for r in result.ranks] == [9, 9, 46, 136]
    text = (case / "system" / "decomposeParDict").read_text()
    assert "method          manual;" in text and '"cellDecomposition"' in text
    assert "numberOfSubdomains 4;" in text
    from foamlib import FoamFile

    labels = np.asarray(FoamFile(case / "constant" / "cellDecomposition")[None])
    np.testing.assert_array_equal(labels, result.assignment)
    assert result.center_source == "wall patches"
    assert result.openfoam_cells is None


def test_failed_decompose_par_restores_everything(
    case: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (case / "system" / "decomposeParDict").write_text("old dict\n")
    (case / "processor0").mkdir()
    (case / "processor0" / "marker").write_text("old")
    before = _case_files(case)

    def fail(case_dir: Path) -> list[int]:
        (case_dir / "processor0").mkdir()
        (case_dir / "processor0" / "half").write_text("partial")
        raise UserError("decomposePar failed")

    monkeypatch.setattr(D, "openfoam_decompose", fail)
    with pytest.raises(UserError, match="decomposePar failed"):
        D.decompose_case(case, 2, "equal")
    assert _case_files(case) == before
    assert not (case / "constant" / "cellDecomposition").exists()
    assert not (case / ".rankpack-stash").exists()


def test_count_mismatch_is_an_error_and_rolls_back(
    case: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _case_files(case)
    monkeypatch.setattr(D, "openfoam_decompose", lambda case_dir: [1, 199])
    with pytest.raises(UserError, match="decomposePar counted"):
        D.decompose_case(case, 2, "equal")
    assert _case_files(case) == before


def test_success_replaces_old_processor_dirs(case: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (case / "processor7").mkdir()

    def ok(case_dir: Path) -> list[int]:
        for i in range(2):
            (case_dir / f"processor{i}").mkdir()
        return [100, 100]

    monkeypatch.setattr(D, "openfoam_decompose", ok)
    result = D.decompose_case(case, 2, "equal")
    assert result.openfoam_cells == (100, 100)
    assert sorted(p.name for p in case.glob("processor*")) == ["processor0", "processor1"]


def test_center_outside_warns(case: Path) -> None:
    result = D.decompose_case(
        case, 2, "concentric", [2, 1], center=(100.0, 0.0, 0.0), run_decompose_par=False
    )
    assert result.center_source == "given"
    assert any("outside the mesh bounding box" in w for w in result.warnings)


def test_default_center_without_walls_is_mesh_box(tmp_path: Path) -> None:
    mesh = grid_mesh(4, 4)
    patches = tuple(type(p)(p.name, "patch", p.start_face, p.n_faces) for p in mesh.patches)
    case = write_case(tmp_path / "c", type(mesh)(**{**mesh.__dict__, "patches": patches}))
    result = D.decompose_case(case, 2, "concentric", [1, 1], run_decompose_par=False)
    assert result.center_source == "mesh bounding box"
    assert result.center == pytest.approx((2.0, 2.0, 0.05))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--method", "concentric", "--ranks", "2"], "needs --weights"),
        (["--weights", "1,0"], "positive number"),
        (["--weights", "1,1,1", "--ranks", "2"], "3 values but --ranks is 2"),
        (["--method", "equal", "--weights", "1,2"], "splits cells equally"),
        (["--ranks", "300"], "300 ranks but the mesh has only 200 cells"),
        (["--weights", "1,1", "--center", "1,2"], "not a point"),
        (["--method", "concentric", "--weights", "1,1", "--write-processor-weights"], "Scotch"),
        (["--ranks", "2", "--output", "/tmp/x"], "only for a tutorial name"),
    ],
)
def test_cli_bad_input_exit_2_case_unchanged(
    case: Path, capsys: pytest.CaptureFixture[str], args: list[str], match: str
) -> None:
    before = _case_files(case)
    assert main(["decompose", str(case), *args]) == 2
    err = capsys.readouterr().err
    assert match in err
    assert err.count("\n") == 1
    assert _case_files(case) == before


def test_cli_missing_mesh_file(case: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (case / "constant" / "polyMesh" / "points").unlink()
    before = _case_files(case)
    assert main(["decompose", str(case), "--weights", "1,2"]) == 2
    assert "points missing" in capsys.readouterr().err
    assert _case_files(case) == before


def _examples(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The OpenFOAM tutorials are looked up under ``root`` (which may not exist)."""
    from rankpack.case import openfoam

    monkeypatch.setattr(openfoam, "EXAMPLES_ROOT", root)
    return root


def test_cli_tutorial_needs_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    examples = _examples(tmp_path / "examples", monkeypatch)
    tutorial = write_case(examples / "incompressible/simpleFoam/pitzDaily", grid_mesh(4, 2))
    before = _case_files(tutorial)
    assert main(["decompose", "pitzDaily", "--ranks", "2"]) == 2
    err = capsys.readouterr().err
    assert "pitzDaily is a tutorial; give --output DIR" in err and err.count("\n") == 1
    assert _case_files(tutorial) == before


def test_cli_tutorial_without_the_examples_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _examples(tmp_path / "no-examples", monkeypatch)
    assert main(["decompose", "pitzDaily", "--ranks", "2", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "OpenFOAM tutorials are not installed" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_cli_json_and_plot(case: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "d.png"
    code = main(
        [
            "decompose", str(case), "--method", "concentric", "--weights", "4,3,2,1",
            "--json", "--no-decompose-par", "--plot", str(png),
        ]
    )  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "concentric"
    assert [r["cells"] for r in out["ranks"]] == [80, 60, 40, 20]
    assert {"rank", "cells", "mean_distance"} <= set(out["ranks"][0])
    assert isinstance(out["edge_cut"], int)
    means = [r["mean_distance"] for r in out["ranks"]]
    assert means == sorted(means)
    assert png.stat().st_size > 1000


def test_processor_weights_write_only(case: Path) -> None:
    result = D.write_processor_weights(case, [1, 1, 5, 15], run_decompose_par=False)
    text = (case / "system" / "decomposeParDict").read_text()
    assert "method          scotch;" in text
    assert "processorWeights (1 1 5 15);" in text
    assert result.openfoam_cells is None
