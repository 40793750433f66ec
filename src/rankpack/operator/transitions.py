"""What each step of a Simulation's life writes into its status: pure builders.

Each returns a `Change`: the status fields to merge-patch, and the conditions to set (one
per type, merged with those the Simulation has by `rankpack.operator.outbox.StatusOutbox`).
Called by the queue (`rankpack.operator.queue`: arrival, hold, claim, launch, requeue,
end) and by its arrivals (`rankpack.operator.arrivals`); no I/O, no clock but the
conditions' transition time.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from rankpack.case.staging import StagedCase
from rankpack.controller.jobs import Job
from rankpack.core.failures import Failure, FailureCode
from rankpack.core.results import RankResult, RunResult, progress_text
from rankpack.operator.codec import resume_to_json, staged_to_json

Obj = dict[str, Any]

LAUNCH_FIELDS = ("usage", "launcher", "simId", "runId", "runDir", "startedAt",
                 "expectedIterations", "iterations", "progress", "staged")  # fmt: skip
"""What `launched` writes into a Simulation's status (a requeue removes it)."""

HOLD_REASONS = {
    "cooldown": "Cooldown",
    "measuring": "Measuring",
    "max-concurrent": "MaxConcurrent",
    "no-room": "NoRoom",
    "quota": "QuotaExceeded",
    "no-gain": "NoGain",
}
"""The policy's launch-held codes as the Queued condition's reason."""


class Change(NamedTuple):
    """A status merge patch and the conditions it sets (`StatusOutbox.patch`)."""

    fields: Obj
    conditions: tuple[Obj, ...] = ()


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, status: bool, reason: str, message: str) -> Obj:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": now_rfc3339(),
    }


def submitted() -> Change:
    """A Simulation admitted at its arrival: queued."""
    waiting = condition("Queued", True, "Submitted", "waiting for the operator")
    return Change({"phase": "Queued"}, (waiting,))


def held(why: str, message: str) -> Change:
    """It waits in the queue: its status's reason and message and its Queued condition say
    why."""
    return Change({"reason": why, "message": message[:1000]},
                  (condition("Queued", True, why, message),))  # fmt: skip


def claimed(identity: str) -> tuple[Obj, ...]:
    """The conditions of a claim (its status is replaced whole: `SimulationQueue.claim`): it
    is ``Starting``, not yet ``Running``."""
    return (
        condition("Queued", False, "Claimed", f"claimed by {identity}"),
        condition("Running", False, "Starting", f"claimed by {identity}: staging"),
    )


def launched(
    job: Job, run_id: int, sim_id: str, staged: StagedCase, facts: dict[str, str]
) -> Change:
    """Its launch: the run, where it runs, and all an adopter needs (``staged``, ``simId``,
    ``runId``, ``startedAt``); ``facts`` are the backend's (`Backend.placement`)."""
    return Change({
        "usage": facts.get("usage"),
        "launcher": facts.get("launcher"),
        "simId": sim_id,
        "runId": run_id,
        "runDir": str(staged.run_dir),
        "startedAt": now_rfc3339(),
        "expectedIterations": staged.expected_iterations,
        "iterations": 0,
        "progress": progress_text(0, staged.expected_iterations),
        "staged": staged_to_json(staged),
        **_resumed(job, staged),
    }, (condition("Running", False, "Launched",
                  f"simulation {sim_id}: its ranks are starting"),))  # fmt: skip


def running(sim_id: str) -> Change:
    """Every rank of its launch runs: ``Running`` only now (issue 40)."""
    ran = condition("Running", True, "RanksRunning", f"simulation {sim_id}")
    return Change({"phase": "Running"}, (ran,))


def _resumed(job: Job, staged: StagedCase) -> Obj:
    """A launch that resumes a run a lost node cut short: ``nodeLost`` says from where
    and the iterations lost (its ``resume`` is done with)."""
    if job.resume is None:
        return {}
    r = job.resume
    return {"resume": None, "nodeLost": {
        "losses": r.losses, "lostRunId": r.lost_run_id, "why": r.why[:1000],
        "iterationsAtLoss": r.done_at_loss(staged),
        "resumedFrom": staged.resumed_from or "start",
        "iterationsKept": staged.start_iterations,
        "iterationsLost": r.lost_now(staged),
        "iterationsLostTotal": r.iterations_lost + r.lost_now(staged),
    }}  # fmt: skip


def requeued(job: Job, why: Failure) -> Change:
    """Back to ``Queued`` with the code as its reason, its launch forgotten (sim id, run,
    staged case); after a lost node its ``resume`` keeps what to resume from."""
    reason = str(why.code)
    resume = {"resume": resume_to_json(job.resume)} if job.resume is not None else {}
    return Change({
        "phase": "Queued", "operator": None, "reason": reason,
        "message": why.message[:1000],
        **dict.fromkeys(LAUNCH_FIELDS), **resume,
    }, (condition("Running", False, reason, why.message),
        condition("Queued", True, reason, why.message)))  # fmt: skip


def unclaimed(reason: str) -> Change:
    """Claimed and never launched (its operator stopped first): back to ``Queued``."""
    return Change({"phase": "Queued", "operator": None}, (
        condition("Running", False, "Requeued", reason),
        condition("Queued", True, "Requeued", reason),
    ))  # fmt: skip


def failed(code: FailureCode, message: str) -> Change:
    """``Failed`` without a run (refused, invalid, lost): ``code`` is the status's and the
    conditions' reason."""
    reason = str(code)
    return Change({
        "phase": "Failed",
        "reason": reason,
        "message": message[:1000],
        "result": {"status": "failed", "reason": reason, "message": message},
    }, (condition("Running", False, reason, "ended"),
        condition("Failed", True, reason, message)))  # fmt: skip


def ended(
    status: str, message: str, failure: FailureCode | None, result: RunResult | None
) -> Change:
    """Its end: ``Succeeded``, or ``Failed`` with the code as the status's and the
    conditions' reason (``failure`` when it ended before it had a run, else the run's own
    code, ``result.failure``); the run's figures from ``result``."""
    res: Obj = {"status": status}
    fields: Obj = {}
    code = failure or (FailureCode.STAGE_FAILED if message else None)  # before a run
    if message:
        res["message"] = message
    if result is not None:
        message = result.message or ""
        code = failure_code(result)
        res.update(
            iterations=result.iterations,
            wallSeconds=round(result.wall_s or 0.0, 3),
            cpuSeconds=round(result.cpu_s or 0.0, 3),
            message=message,
            restarts=result.restarts,
            resizes=sum(1 for r in result.resizes if r.status == "completed"),
            ranks=[_rank_result(r) for r in result.ranks],
        )
        fields.update(iterations=result.iterations, resizes=res["resizes"],
                      restarts=result.restarts, progress=result.progress)  # fmt: skip
    phase = "Succeeded" if status == "completed" else "Failed"
    if phase == "Succeeded":
        end = condition("Succeeded", True, "Completed", message or status)
    else:
        reason = code or FailureCode.OTHER
        res["reason"] = str(reason)
        end = condition("Failed", True, reason, message or status)
        fields.update(reason=str(reason), message=(message or status)[:1000])
    fields.update(phase=phase, result=res)
    return Change(fields, (
        condition("Running", False, end["reason"], "ended"),
        condition("ResizeDeferred", False, "Ended", "the run ended"), end,
    ))  # fmt: skip


def _rank_result(r: RankResult) -> Obj:
    """A rank's figures over its whole run (watched, or from its final record when the run
    ended while no operator ran): its duty cycle (when known) and CPU-seconds."""
    out: Obj = {"rank": r.rank, "cpuSeconds": round(r.cpu_s or 0.0, 3)}
    if r.duty is not None:
        out["duty"] = round(r.duty, 4)
    if r.node:
        out["node"] = r.node
    return out


def failure_code(result: RunResult) -> FailureCode:
    """A failed run's code (`RunResult.failure`); OTHER for a run without one (recorded
    before codes, e.g. read back from an old database) or with a code this version does
    not know."""
    try:
        return FailureCode(result.failure) if result.failure else FailureCode.OTHER
    except ValueError:
        return FailureCode.OTHER
