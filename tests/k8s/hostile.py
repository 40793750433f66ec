"""Hostile cases for the staging sandbox test (issue 39): their code runs while they are
staged (an Allrun step that is a shell, which the scanner refuses; the test's operator runs
with ``--case-scan off`` so that the sandbox, not the scanner, is what is tested).

`escaping_case` tries to write a marker wherever it can reach (the operator's store
directory, the run directories' parent, the case root, another Simulation's run
directory), to copy a ServiceAccount token and to list what it sees, then meshes as the
tutorial does; `sleeping_case` stages for longer than any deadline.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

MARK = "MARK-escape"
"""The file name every escape attempt writes."""
OWN_MARK = "MARK-own"
"""Written in the staging pod's working directory (the run directory): proof it ran."""
TOKEN_COPY = "MARK-token"
LISTING = "MARK-ls"


def _case(where: Path, name: str, steps: list[list[str]]) -> Path:
    from rankpack.case.openfoam import EXAMPLES_ROOT, KNOWN_TUTORIALS

    case = where / name
    if case.exists():
        shutil.rmtree(case)
    shutil.copytree(EXAMPLES_ROOT / KNOWN_TUTORIALS["pitzDaily"], case)
    lines = ["#!/bin/sh", "cd ${0%/*} || exit 1", ". ${WM_PROJECT_DIR:?}/bin/tools/RunFunctions"]
    lines += ["runApplication " + shlex.join(argv) for argv in steps]
    lines.append("runApplication $(getApplication)")
    (case / "Allrun").write_text("\n".join(lines) + "\n")
    return case


def escaping_case(where: Path, targets: list[str]) -> Path:
    """A case whose first meshing step writes `MARK` into each of ``targets`` (directories
    as a pod would name them), `OWN_MARK` where it runs, copies the token, lists
    ``/var/lib/rankpack``."""
    tries = "; ".join(f"echo escaped > {shlex.quote(t + '/' + MARK)} 2>/dev/null" for t in targets)
    script = (
        f'echo ran > "$PWD/{OWN_MARK}"; {tries}; '
        f'cat /var/run/secrets/kubernetes.io/serviceaccount/token > "$PWD/{TOKEN_COPY}" '
        f'2>/dev/null; ls -a /var/lib/rankpack /var/lib/rankpack/runs > "$PWD/{LISTING}" 2>&1; '
        "true"
    )
    return _case(where, "hostileEscape", [["sh", "-c", script], ["blockMesh"]])


def sleeping_case(where: Path) -> Path:
    """A case whose staging does not end (its first meshing step sleeps)."""
    return _case(where, "hostileSleeper", [["sh", "-c", "sleep 3600"], ["blockMesh"]])
