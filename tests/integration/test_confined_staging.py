"""Confined staging as a non-root process: a case that tries to run code or read a file
outside itself is refused with the place and the reason, nothing runs, nothing leaks; a
plain tutorial stages (meshed and decomposed by the real OpenFOAM tools) as that user."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PITZ = Path("/usr/share/doc/openfoam-examples/examples/incompressible/simpleFoam/pitzDaily")
NOBODY = 65534
SECRET = "tok-3f9a1c-do-not-leak"

_STAGE = """
import json, sys
from pathlib import Path
from rankpack.case import staging
from rankpack.errors import UserError
spec = staging.StageSpec("s1", sys.argv[1], 2, Path(sys.argv[2]), iterations=1, confined=True)
try:
    staged = staging.stage(spec)
except UserError as exc:
    print(json.dumps({"refused": type(exc).__name__, "message": str(exc)}))
else:
    print(json.dumps({"run_dir": str(staged.run_dir), "cells": list(staged.cells_per_rank)}))
"""


@pytest.fixture
def area() -> Iterator[Path]:
    """A directory the unprivileged user can use (pytest's tmp_path is root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="rankpack-confine-"))
    root.chmod(0o777)
    (root / "secret").write_text(SECRET)
    (root / "secret").chmod(0o644)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _case(area: Path, name: str) -> Path:
    case = area / name
    shutil.copytree(PITZ, case)
    return case


def _stage_as_nobody(area: Path, case: Path) -> dict[str, object]:
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed"
    for path in [area, *area.rglob("*")]:
        if not path.is_symlink():
            os.chown(path, NOBODY, NOBODY)
    env = {**os.environ, "HOME": str(area), "RANKPACK_HOME": str(area / "home")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.run(
        [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         sys.executable, "-c", _STAGE, str(case), str(area / "runs")],
        capture_output=True, text=True, env=env, timeout=240, cwd=area,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _nothing_ran_or_leaked(area: Path) -> None:
    assert not (area / "marker").exists(), "the case's code ran"
    for path in area.rglob("*"):
        if path.is_file() and path.name != "secret" and not path.is_symlink():
            assert SECRET not in path.read_text(errors="replace"), f"{path} has the secret"
    assert not list((area / "runs").glob("*")) if (area / "runs").exists() else True


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_a_plain_tutorial_stages_as_a_non_root_user(area: Path) -> None:
    result = _stage_as_nobody(area, _case(area, "plain"))
    assert "refused" not in result, result
    assert sum(result["cells"]) == 12225  # type: ignore[arg-type]  # json list of ints
    run_dir = Path(str(result["run_dir"]))
    assert (run_dir / "processor1" / "constant" / "polyMesh" / "owner").is_file()


def test_code_in_a_dictionary_is_refused_before_any_tool_runs(area: Path) -> None:
    case = _case(area, "codestream")
    _edit(case / "system" / "blockMeshDict", "scale   0.001;",
          'scale #codeStream { code #{ system("touch ' + str(area / "marker") + '");'
          " os << 0.001; #}; };")  # fmt: skip
    result = _stage_as_nobody(area, case)
    assert result["refused"] == "CaseNotConfined"
    assert str(result["message"]).startswith("system/blockMeshDict:")
    assert "#codeStream compiles and runs code" in str(result["message"])
    _nothing_ran_or_leaked(area)


def test_a_system_call_and_the_switch_that_allows_it_are_refused(area: Path) -> None:
    case = _case(area, "systemcall")
    call = f'executeCalls ("touch {area / "marker"}");'
    _edit(case / "system" / "controlDict", "functions",
          "InfoSwitches { allowSystemOperations 1; }\nfunctions { touch { type systemCall; "
          f"libs (utilityFunctionObjects); {call} }} }}\nunused")  # fmt: skip
    result = _stage_as_nobody(area, case)
    assert result["refused"] == "CaseNotConfined"
    assert "allowSystemOperations would turn system operations back on" in str(result["message"])
    assert "(and 1 more)" in str(result["message"])
    _nothing_ran_or_leaked(area)


def test_an_include_of_a_file_outside_the_case_is_refused(area: Path) -> None:
    case = _case(area, "include")
    _edit(case / "system" / "fvSolution", "SIMPLE", f'#include "{area / "secret"}"\nSIMPLE')
    result = _stage_as_nobody(area, case)
    assert result["refused"] == "CaseNotConfined"
    assert "reads a file outside the case" in str(result["message"])
    _nothing_ran_or_leaked(area)


def test_a_link_to_a_file_outside_the_case_is_not_copied(area: Path) -> None:
    case = _case(area, "link")
    os.symlink(area / "secret", case / "constant" / "token")
    result = _stage_as_nobody(area, case)
    assert result["refused"] == "CaseNotConfined"
    assert "is a link to" in str(result["message"])
    _nothing_ran_or_leaked(area)


def test_an_allrun_that_runs_a_shell_is_refused(area: Path) -> None:
    case = _case(area, "allrun")
    (case / "Allrun").write_text(
        f"#!/bin/sh\nrunApplication sh -c 'touch {area / 'marker'}'\n"
        "runApplication blockMesh\nrunApplication $(getApplication)\n"
    )
    result = _stage_as_nobody(area, case)
    assert result["refused"] == "CaseNotConfined"
    assert "Allrun runs 'sh'" in str(result["message"])
    _nothing_ran_or_leaked(area)


def test_the_sandbox_program_stages_in_place_and_answers_in_bounds(area: Path) -> None:
    """`rankpack-stage` as a staging pod runs it: the case staged into the (empty) run
    directory itself, the answer a bounded JSON the operator parses; a case that is none
    answers NotACase and leaves the directory empty."""
    from rankpack.case import sandbox, stagewire
    from rankpack.case.staging import StageSpec

    run_dir = area / "run"
    run_dir.mkdir()
    answer = area / "answer"
    spec = StageSpec("s1", "pitzDaily", 2, area, iterations=3, confined=True)
    assert sandbox.main([stagewire.request_text(spec, run_dir)], answer_to=answer) == 0
    staged = stagewire.parse_answer(answer.read_text(), run_dir, "pitzDaily", 2)
    assert not isinstance(staged, stagewire.SandboxFailure), staged
    assert sum(staged.cells_per_rank) == 12225 and staged.solver == "simpleFoam"
    assert (run_dir / "processor1" / "constant" / "polyMesh").is_dir()
    empty = area / "run2"
    empty.mkdir()
    none = StageSpec("s2", str(area / "nothing-here"), 2, area, confined=True)
    assert sandbox.main([stagewire.request_text(none, empty)], answer_to=answer) == 2
    failed = stagewire.parse_answer(answer.read_text(), empty, "x", 2)
    assert isinstance(failed, stagewire.SandboxFailure) and failed.code.value == "NotACase"
    assert list(empty.iterdir()) == []
    assert sandbox.main(["{not json"], answer_to=answer) == 2
