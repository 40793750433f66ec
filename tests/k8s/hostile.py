"""Hostile cases for the staging sandbox test (issue 39): their code runs while they are
staged (an Allrun step that is a shell, which the scanner refuses; the test's operator runs
with ``--case-scan off`` so that the sandbox, not the scanner, is what is tested).

`escaping_case` tries to write a marker wherever it can reach (the operator's store
directory, the run directories' parent, the case root, another Simulation's run
directory), to copy a ServiceAccount token and to list what it sees, then meshes as the
tutorial does; `sleeping_case` stages for longer than any deadline.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

MARK = "MARK-escape"
"""The file name every escape attempt writes."""
OWN_MARK = "MARK-own"
"""Written in the staging pod's working directory (the run directory): proof it ran."""
TOKEN_COPY = "MARK-token"
LISTING = "MARK-ls"
STAGING_DEADLINE_S = 60
SANDBOX_FLAGS = ("--case-scan", "off", "--staging-deadline", str(STAGING_DEADLINE_S))
"""The in-cluster operator's flags for these tests: the sandbox, not the scanner, is tested,
and a deadline a test can wait for."""


def give_to_pods(case: Path, uid: int) -> None:
    """The case's files owned by the pods' user (as a user's files on the volume are)."""
    for path in [case, *case.rglob("*")]:
        os.chown(path, uid, uid)


def _since(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def condition_time(st: dict[str, Any], kind: str) -> float | None:
    """When a Simulation's status condition ``kind`` became True (None: it is not)."""
    for c in st.get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return _since(c["lastTransitionTime"])
    return None


def event_time(events: Iterable[dict[str, Any]], reason: str) -> float | None:
    """The first of these Events with ``reason`` (None: none)."""
    stamps = [e.get("eventTime") or e.get("firstTimestamp") or e.get("lastTimestamp")
              for e in events if e.get("reason") == reason]  # fmt: skip
    return min((_since(t) for t in stamps if t), default=None)


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


LIB_MARK = "MARK-lib-"
"""`library_case`'s library writes ``MARK-lib-<program>`` where each program that loads it
runs (its working directory: the run directory)."""
_LIBRARY = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *targets[] = {TARGETS};

__attribute__((constructor)) static void hostile(void) {
    char exe[512] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    char path[1024];
    snprintf(path, sizeof path, "%s%s", LIB_MARK, base);
    FILE *f = fopen(path, "w");
    if (f) { fputs("ran\n", f); fclose(f); }
    for (unsigned i = 0; i < sizeof targets / sizeof *targets; i++) {
        snprintf(path, sizeof path, "%s/%s", targets[i], MARK);
        f = fopen(path, "w");
        if (f) { fputs("escaped\n", f); fclose(f); }
    }
    if (strcmp(base, "simpleFoam") == 0) {  /* a rank: its log becomes a link to the store */
        unlink("log.simpleFoam");
        symlink(STORE, "log.simpleFoam");
    }
}
"""


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def library_case(where: Path, targets: list[str], store: str) -> Path:
    """A case whose controlDict loads a library of its own (``libs``: every OpenFOAM program
    of the case loads it, the meshing in staging and the solver in each rank). Its
    constructor writes `LIB_MARK` + the program's name where it runs, `MARK` into each of
    ``targets``, and in a rank replaces the solver's log with a link to ``store`` (the
    operator's SQLite file, as the operator's pod would name it)."""
    import subprocess

    case = _case(where, "hostileLibrary", [["blockMesh"]])
    source = where / "hostile.c"
    source.write_text(_LIBRARY)
    defines = [f"-DTARGETS={', '.join(_c_string(t) for t in targets) or '0'}",
               f"-DLIB_MARK={_c_string(LIB_MARK)}", f"-DMARK={_c_string(MARK)}",
               f"-DSTORE={_c_string(store)}"]  # fmt: skip
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", *defines, "-o",
                    str(case / "libhostile.so"), str(source)], check=True)  # fmt: skip
    source.unlink()
    control = case / "system" / "controlDict"
    control.write_text(control.read_text() + '\nlibs ("./libhostile.so");\n')
    return case


SECRET = "MARK-secret"
"""Written in another Simulation's directory that `linked_case` points at."""


def linked_case(where: Path, other: Path, other_in_pod: Path) -> Path:
    """A case that is a link to ``other`` (a whole case of another Simulation, with a
    `SECRET` file; ``other_in_pod`` as a pod would name it), placed after admission would
    have looked."""
    if not (other / "system" / "controlDict").exists():
        shutil.rmtree(other, ignore_errors=True)
        _case(other.parent, other.name, [["blockMesh"]])
    (other / SECRET).write_text(SECRET + "\n")
    link = where / "hostileLink"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(other_in_pod)
    return link
