"""What a Simulation's status keeps of a launch, as JSON and back.

A launch writes its staged case into the status (``staged``), so that whichever operator
leads next can adopt the run (`rankpack.operator.adoption`); a run a lost node cut short
keeps its case and the iterations done (``resume``), so that whichever operator launches it
next resumes it (`rankpack.operator.queue`). Pure: no I/O.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rankpack.case.staging import StagedCase
from rankpack.controller.jobs import Resume

Obj = dict[str, Any]


def staged_to_json(staged: StagedCase) -> Obj:
    return {
        "runDir": str(staged.run_dir),
        "caseName": staged.case_name,
        "caseSource": staged.case_source,
        "solver": staged.solver,
        "cellsPerRank": list(staged.cells_per_rank),
        "expectedIterations": staged.expected_iterations,
        **({"resumedFrom": staged.resumed_from} if staged.resumed_from else {}),
        **({"startIterations": staged.start_iterations} if staged.start_iterations else {}),
    }


def staged_from_json(d: Obj) -> StagedCase:
    return StagedCase(
        run_dir=Path(d["runDir"]),
        case_name=str(d["caseName"]),
        case_source=str(d["caseSource"]),
        solver=str(d["solver"]),
        cells_per_rank=tuple(int(c) for c in d["cellsPerRank"]),
        expected_iterations=int(d["expectedIterations"]),
        resumed_from=str(d["resumedFrom"]) if d.get("resumedFrom") else None,
        start_iterations=int(d.get("startIterations") or 0),
    )


def resume_to_json(resume: Resume) -> Obj:
    """What a Simulation requeued after a lost node keeps in its status (``resume``): its
    case, to be staged again from its last write by whichever operator launches it."""
    return {
        "staged": staged_to_json(resume.staged),
        "iterationsAtLoss": resume.iterations_at_loss,
        "lostRunId": resume.lost_run_id,
        "why": resume.why[:1000],
        "losses": resume.losses,
        "iterationsLost": resume.iterations_lost,
    }


def resume_from_json(d: Obj | None) -> Resume | None:
    """`resume_to_json` read back (None: none, or not readable: it starts over)."""
    if not d:
        return None
    try:
        return Resume(
            staged=staged_from_json(d["staged"]),
            iterations_at_loss=int(d.get("iterationsAtLoss") or 0),
            lost_run_id=int(d["lostRunId"]) if d.get("lostRunId") is not None else None,
            why=str(d.get("why") or ""), losses=int(d.get("losses") or 1),
            iterations_lost=int(d.get("iterationsLost") or 0),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError):
        return None
