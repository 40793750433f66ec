"""What a staging sandbox is asked and what it answers, as bounded JSON. Pure: no I/O.

A sandbox (`rankpack.case.sandbox`, in a staging pod of the Simulation's namespace) is
given a `StageSpec` as one command-line argument (`request_text`: data, never a shell
word) and answers in its container's termination message, which the kubelet caps at
4096 bytes and the apiserver hands back in the pod's status: the operator reads that
and no file of the case. The answer is parsed strictly (`parse_answer`): the sandbox runs
the user's code, so it is as untrusted as the case, and a field out of shape is an
error, never a guess.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankpack import quantities
from rankpack.case.staging import DECOMPOSITIONS, StagedCase, StageSpec
from rankpack.core.failures import FailureCode
from rankpack.core.names import SOLVER_PATTERN

MESSAGE_MAX = 4096
"""The kubelet keeps at most this much of a termination message."""
MAX_RANKS = quantities.MAX_RANKS
"""The most ranks a staging reports cells for (as many as a Simulation may have)."""
CELLS_FILE = "rankpack-cells.json"
"""Where the cells per rank go when they do not fit the answer (about 300 ranks and more):
a file of the run directory, named in the answer, read as untrusted (a regular file, never
through a link, at most `CELLS_FILE_MAX` bytes) and parsed as strictly."""
CELLS_FILE_MAX = 64 << 10
TEXT_MAX = 400
"""The longest text field an answer may hold (an error, a name, a solver)."""
MAX_ITERATIONS = 100_000_000
"""The most iterations a staging is asked for (and a Simulation may ask: `operator.crd`)."""
_FIELDS = frozenset(
    {"ok", "error", "code", "caseName", "caseSource", "solver", "cellsPerRank",
     "expectedIterations", "warnings", "resumedFrom", "startIterations", "cellsFile", "mpi"}
)  # fmt: skip


class BadAnswer(ValueError):
    """A sandbox's answer that is not one (too long, not JSON, a field out of shape)."""


@dataclass(frozen=True)
class SandboxFailure:
    """A sandbox's answer that staging failed: what it said and its code."""

    error: str
    code: FailureCode


# -- the request ---------------------------------------------------------------------------


def request_text(spec: StageSpec, run_dir: Path) -> str:
    """``spec`` as the sandbox's one argument: stage into ``run_dir`` (its mount)."""
    data: dict[str, Any] = {
        "simId": spec.sim_id,
        "case": spec.case,
        "ranks": spec.n_ranks,
        "runDir": str(run_dir),
        "iterations": spec.iterations,
        "decompose": spec.decompose,
        "weights": list(spec.decompose_weights),
        "center": list(spec.center) if spec.center is not None else None,
        "scan": spec.scan,
    }
    if spec.resume is not None:
        data["resume"] = _staged_json(spec.resume)
    return json.dumps(data, separators=(",", ":"))


def parse_request(text: str) -> StageSpec:
    """`request_text` read back in the sandbox (ValueError if it is not one)."""
    d = json.loads(text)
    if not isinstance(d, dict):
        raise ValueError("the request is not an object")
    run_dir = Path(_text(d, "runDir"))
    center = d.get("center")
    decompose = _text(d, "decompose")
    if decompose not in DECOMPOSITIONS:
        raise ValueError(f"decomposition {decompose!r} unknown")
    resume = d.get("resume")
    return StageSpec(
        sim_id=_text(d, "simId"),
        case=_text(d, "case"),
        n_ranks=_int(d, "ranks", 1, MAX_RANKS),
        runs_root=run_dir.parent,
        iterations=None if d.get("iterations") is None else _int(d, "iterations", 1,
                                                                  MAX_ITERATIONS),
        decompose=decompose,
        decompose_weights=tuple(float(w) for w in _list(d, "weights")),
        center=None if center is None else (float(center[0]), float(center[1]),
                                            float(center[2])),
        workdir=run_dir,
        confined=True,
        scan=bool(d.get("scan", True)),
        in_place=True,
        resume=None if resume is None else _staged_of(resume, run_dir),
    )  # fmt: skip


def _staged_json(staged: StagedCase) -> dict[str, Any]:
    return {
        "caseName": staged.case_name, "caseSource": staged.case_source,
        "solver": staged.solver, "cellsPerRank": list(staged.cells_per_rank),
        "expectedIterations": staged.expected_iterations,
    }  # fmt: skip


def _staged_of(d: Any, run_dir: Path) -> StagedCase:
    if not isinstance(d, dict):
        raise ValueError("resume is not an object")
    return StagedCase(
        run_dir=run_dir, case_name=_text(d, "caseName"), case_source=_text(d, "caseSource"),
        solver=_solver(d), cells_per_rank=_cells(d),
        expected_iterations=_int(d, "expectedIterations", 1, MAX_ITERATIONS),
    )  # fmt: skip


# -- the answer ----------------------------------------------------------------------------


def answer_text(staged: StagedCase, write_cells: Callable[[str], None] | None = None) -> str:
    """A staged case as the sandbox's answer; cells that do not fit go to `CELLS_FILE`
    through ``write_cells`` (ValueError if it still does not fit)."""
    data = {"ok": True, **_staged_json(staged), "warnings": list(staged.warnings)}
    if staged.resumed_from is not None:
        data["resumedFrom"] = staged.resumed_from
    if staged.start_iterations:
        data["startIterations"] = staged.start_iterations
    if staged.mpi is not None:
        data["mpi"] = staged.mpi
    text = json.dumps(data, separators=(",", ":"))
    if len(text.encode()) > MESSAGE_MAX:
        # warnings are the one part of no consequence: drop them before failing
        data["warnings"] = []
        text = json.dumps(data, separators=(",", ":"))
    if len(text.encode()) > MESSAGE_MAX and write_cells is not None:
        write_cells(json.dumps(data.pop("cellsPerRank"), separators=(",", ":")))
        data["cellsFile"] = CELLS_FILE
        text = json.dumps(data, separators=(",", ":"))
    if len(text.encode()) > MESSAGE_MAX:
        raise ValueError(f"the staged case's summary is over {MESSAGE_MAX} bytes")
    return text


def failure_text(error: str, code: FailureCode) -> str:
    """A failed stage as the sandbox's answer (the error cut to fit)."""
    return json.dumps({"ok": False, "error": error[:TEXT_MAX], "code": code.value},
                      separators=(",", ":"))  # fmt: skip


def parse_answer(
    text: str,
    run_dir: Path,
    source_hint: str,
    n_ranks: int,
    read_cells: Callable[[str], str] | None = None,
) -> StagedCase | SandboxFailure:
    """A termination message read back: the staged case of ``n_ranks`` ranks in ``run_dir``
    or the failure it reports; `BadAnswer` if it is neither. ``source_hint`` (the path asked
    for) stands in for a source the answer gives out of shape; ``read_cells`` reads the
    `CELLS_FILE` an answer may name (None: none may)."""
    if len(text.encode(errors="replace")) > MESSAGE_MAX:
        raise BadAnswer(f"an answer over {MESSAGE_MAX} bytes")
    try:
        d = json.loads(text)
    except ValueError:
        raise BadAnswer("an answer that is not JSON") from None
    if not isinstance(d, dict) or not set(d) <= _FIELDS or not isinstance(d.get("ok"), bool):
        raise BadAnswer("an answer out of shape")
    try:
        if not d["ok"]:
            code = FailureCode(_text(d, "code"))
            if code not in (FailureCode.NOT_A_CASE, FailureCode.CASE_NOT_CONFINED,
                            FailureCode.STAGE_FAILED):  # fmt: skip
                code = FailureCode.STAGE_FAILED
            return SandboxFailure(_text(d, "error"), code)
        source = d.get("caseSource")
        warnings = _list(d, "warnings")
        if "cellsFile" in d:
            if d["cellsFile"] != CELLS_FILE or "cellsPerRank" in d or read_cells is None:
                raise ValueError("cellsFile is not rankpack's")
            d["cellsPerRank"] = json.loads(read_cells(CELLS_FILE))
        if len(_cells(d)) != n_ranks:
            raise ValueError(f"cellsPerRank does not list {n_ranks} ranks")
        return StagedCase(
            run_dir=run_dir,
            case_name=_text(d, "caseName"),
            case_source=source if isinstance(source, str) and len(source) <= TEXT_MAX
            else source_hint,
            solver=_solver(d),
            cells_per_rank=_cells(d),
            expected_iterations=_int(d, "expectedIterations", 1, MAX_ITERATIONS),
            warnings=tuple(str(w)[:TEXT_MAX] for w in warnings if isinstance(w, str))[:16],
            resumed_from=None if d.get("resumedFrom") is None else _text(d, "resumedFrom"),
            start_iterations=int(_int(d, "startIterations", 0, MAX_ITERATIONS)
                                 if "startIterations" in d else 0),
            mpi=_mpi(d),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise BadAnswer(f"an answer out of shape ({exc})") from None


def _text(d: dict[str, Any], key: str) -> str:
    value = d[key]
    if not isinstance(value, str) or not value or len(value) > TEXT_MAX or "\x00" in value:
        raise ValueError(f"{key} is not a short text")
    return value


def _int(d: dict[str, Any], key: str, least: int, most: int) -> int:
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ValueError(f"{key} is not a whole number from {least} to {most}")
    return value


def _list(d: dict[str, Any], key: str) -> list[Any]:
    value = d.get(key) or []
    if not isinstance(value, list) or len(value) > MAX_RANKS:
        raise ValueError(f"{key} is not a short list")
    return value


SOLVER_NAME = re.compile(SOLVER_PATTERN)
"""A solver's name as a Simulation may give it (`core.names`): a program of the image's,
such as ``rankloop-serial``."""


def _solver(d: dict[str, Any]) -> str:
    solver = _text(d, "solver")
    if not SOLVER_NAME.fullmatch(solver):
        raise ValueError("solver is not a program name")
    return solver


MPI_VALUES = frozenset({"openmpi", "mpich", "none"})
"""What an answer's ``mpi`` may say (`staging.detect_mpi`; absent: not told)."""


def _mpi(d: dict[str, Any]) -> str | None:
    value = d.get("mpi")
    if value is None:
        return None
    if not isinstance(value, str) or value not in MPI_VALUES:
        raise ValueError(f"mpi is not one of {', '.join(sorted(MPI_VALUES))}")
    return str(value)


def _cells(d: dict[str, Any]) -> tuple[int, ...]:
    cells = _list(d, "cellsPerRank")
    if not cells or any(isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < 10**10
                        for c in cells):  # fmt: skip
        raise ValueError("cellsPerRank is not a list of cell counts")
    return tuple(cells)
