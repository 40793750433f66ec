"""Confined staging refuses a case's code and reads of files outside it (files only)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rankpack import paths
from rankpack.case import confine

PITZ = Path("/usr/share/doc/openfoam-examples/examples/incompressible/simpleFoam/pitzDaily")


@pytest.fixture
def plain_case(tmp_path: Path) -> Path:
    root = tmp_path / "case"
    for sub in ("system", "constant", "0"):
        (root / sub).mkdir(parents=True)
    (root / "system" / "controlDict").write_text(
        "application simpleFoam;\n// #codeStream in a comment is not code\n"
        "/* type coded; */\nfunctions { #includeFunc streamlines }\n"
    )
    (root / "system" / "fvSchemes").write_text('#include "fvSchemes.common"\n')
    (root / "system" / "fvSchemes.common").write_text("ddtSchemes { default steadyState; }\n")
    (root / "0" / "U").write_text('#includeEtc "caseDicts/setConstraintTypes"\n')
    return root


def test_a_plain_case_passes(plain_case: Path) -> None:
    assert confine.scan(plain_case) == []
    confine.check_case(plain_case)


@pytest.mark.skipif(not PITZ.is_dir(), reason="openfoam-examples not installed")
def test_the_tutorial_passes() -> None:
    assert confine.scan(PITZ) == []


@pytest.mark.parametrize(
    ("file", "text", "what"),
    [
        ("system/blockMeshDict", "scale #codeStream { code #{ system(\"id\"); #}; };",
         "#codeStream compiles"),
        ("system/blockMeshDict", "x #calc \"1+1\";", "#calc compiles"),
        ("0/U", "inlet { type codedFixedValue; name x; }", "type codedFixedValue"),
        ("constant/fvOptions", "s { type scalarCodedSource; }", "type scalarCodedSource"),
        ("system/controlDict", "functions { f { type systemCall; executeCalls (\"id\"); } }",
         "systemCall"),
        ("system/controlDict", "InfoSwitches { allowSystemOperations 1; }",
         "allowSystemOperations"),
        ("system/controlDict", 'libs ("/tmp/evil.so");', "libs names '/tmp/evil.so'"),
        ("system/fvSolution", '#include "/etc/passwd"', "outside the case"),
        ("system/fvSolution", '#include "../../../../etc/passwd"', "outside the case"),
        ("system/fvSolution", '#include "$FOAM_CASE/../secret"', "outside the case"),
        ("system/fvSolution", '#sinclude "$HOME/.kube/config"', "files of the case only"),
        ("system/fvSolution", '#includeEtc "../../../etc/shadow"', "names a path"),
    ],
)  # fmt: skip
def test_each_way_out_is_refused(plain_case: Path, file: str, text: str, what: str) -> None:
    (plain_case / file).write_text(f"a 1;\n{text}\n")
    found = confine.scan(plain_case)
    assert [f.what for f in found if what in f.what], found
    assert found[0].line == 2 and found[0].path == (plain_case / file).resolve()
    with pytest.raises(confine.CaseNotConfined, match=f"^{file}:2: "):
        confine.check_case(plain_case)


def test_includes_inside_the_case_pass(plain_case: Path) -> None:
    (plain_case / "system" / "fvSolution").write_text(
        '#include "$FOAM_CASE/system/fvSchemes.common"\n#include "<system>/fvSchemes.common"\n'
        '#include "../system/fvSchemes.common"\n'
    )
    assert confine.scan(plain_case) == []


def test_a_large_file_is_searched_in_chunks(plain_case: Path) -> None:
    points = plain_case / "constant" / "polyMesh" / "points"
    points.parent.mkdir()
    filler = b"(0 0 0)\n" * (700_000)  # over the text limit, several chunks
    points.write_bytes(filler + b"\nx #codeStream {};\n")
    (found,) = confine.scan(plain_case)
    assert found.line == 700_002 and "#codeStream" in found.what


def test_a_link_out_of_the_case_is_refused_before_the_copy(
    plain_case: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret")
    os.symlink(secret, plain_case / "constant" / "token")
    with pytest.raises(confine.CaseNotConfined, match=r"link to .*token, outside the case"):
        paths.check_tree(plain_case, on_link=confine.check_link)
    (plain_case / "constant" / "token").unlink()
    os.symlink(plain_case / "system" / "controlDict", plain_case / "constant" / "inside")
    paths.check_tree(plain_case, on_link=confine.check_link)


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["sh", "-c", "id"], "runs 'sh'"),
        (["./makeMesh"], "runs './makeMesh'"),
        (["blockMesh", "-dict", "/etc/passwd"], "outside the case"),
        (["blockMesh", "-dict", "$HOME/x"], "outside the case"),
        (["snappyHexMesh", "-lib", "evil"], "no extra libraries"),
        (["topoSet", "-case", "/other"], "no extra libraries"),
    ],
)
def test_meshing_runs_only_mesh_utilities_inside_the_case(
    plain_case: Path, argv: list[str], what: str
) -> None:
    with pytest.raises(confine.CaseNotConfined, match=what):
        confine.check_steps([argv], plain_case)


def test_meshing_steps_of_tutorials_pass(plain_case: Path) -> None:
    confine.check_steps(
        [["blockMesh"], ["topoSet", "-dict", "system/topoSetDict"], ["setFields"]], plain_case
    )


def test_refusal_is_a_user_error(plain_case: Path) -> None:
    shutil.copy(plain_case / "system" / "controlDict", plain_case / "system" / "x")
    (plain_case / "system" / "x").write_text("type coded;\n")
    with pytest.raises(confine.CaseNotConfined) as info:
        confine.check_case(plain_case)
    assert "run the case with your own rights (rankpack run)" in str(info.value)
