"""Jobs handed back to their source: a launch refused for a reason that passes, a run a
lost node cut short, and what a resumed run records.

`Requeue.refused`: the backend refused a launch for a reason that passes (`LaunchRefused`:
the namespace's quota, taken by another tenant between plan and create) and left nothing
of it; the launch is undone and the job launched again after a back-off. `Requeue.lost`: a
run a lost node cut short (``NodeLost``) goes back with what to resume from (`Resume`),
staged again from its last complete write. Called by the starter
(`rankpack.controller.launching`) and the loop (`rankpack.controller.loop`, at a run's end).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

from rankpack.backend.protocol import BackendError, LaunchRefused, StagedCase
from rankpack.controller.jobs import Resume
from rankpack.controller.policy import requeue_delay_s
from rankpack.controller.tracked import LoopContext, Requeued, Tracked
from rankpack.core.failures import Failure, FailureCode
from rankpack.core.results import RunResult


class Requeue:
    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx

    def refused(self, sim: Tracked, exc: LaunchRefused) -> None:
        """The backend refused the launch for a reason that passes (the namespace's quota,
        taken by someone else between plan and create) and left nothing of it: undo the
        launch (its staged copy released, its run row marked ``requeued``) and hand the job
        back to its source, which launches it again after a back-off
        (`policy.requeue_delay_s`), once the quota has room. Nothing fails."""
        ctx, job = self.ctx, sim.job
        with contextlib.suppress(BackendError):
            ctx.backend.release(sim.sim_id)
        ctx.sims.pop(sim.sim_id, None)
        before = ctx.requeued.get(job.queue_id)
        attempt = before.attempts if before else 0
        delay = requeue_delay_s(attempt)
        ctx.requeued[job.queue_id] = Requeued(attempt + 1, ctx.now() + delay, str(exc))
        message = f"{exc}; back in the queue, tried again in {delay:g} s at the earliest"
        assert sim.run_id is not None
        ctx.store.requeue_run(sim.run_id, message, exc.code.value)
        ctx.jobs.requeued(job, Failure(exc.code, message))
        ctx.event(sim.run_id, "launch-requeued", queue_id=job.queue_id, sim=sim.sim_id,
                  code=exc.code.value, attempt=attempt + 1, delay_s=delay,
                  reason=message)  # fmt: skip

    def unschedulable(self, sim: Tracked, result: RunResult) -> bool:
        """A launch the scheduler could not place (``Unschedulable``: a rank pod found no
        node, the backend deleted its pods; recorded already): its run row marked
        ``requeued`` and its job handed back to its source with the scheduler's reason,
        launched again after a back-off (`policy.requeue_delay_s`). False (nothing done)
        for any other end."""
        if result.failure != FailureCode.UNSCHEDULABLE.value:
            return False
        ctx, job = self.ctx, sim.job
        before = ctx.requeued.get(job.queue_id)
        attempt = before.attempts if before else 0
        delay = requeue_delay_s(attempt)
        message = (f"{result.message}; the launch was rolled back, back in the queue, tried "
                   f"again in {delay:g} s at the earliest")  # fmt: skip
        ctx.requeued[job.queue_id] = Requeued(attempt + 1, ctx.now() + delay, message)
        assert sim.run_id is not None
        ctx.store.requeue_run(sim.run_id, message, FailureCode.UNSCHEDULABLE.value)
        ctx.sims.pop(sim.sim_id, None)
        ctx.jobs.requeued(job, Failure(FailureCode.UNSCHEDULABLE, message))
        ctx.event(sim.run_id, "launch-requeued", queue_id=job.queue_id, sim=sim.sim_id,
                  code=FailureCode.UNSCHEDULABLE.value, attempt=attempt + 1, delay_s=delay,
                  reason=message)  # fmt: skip
        return True

    def lost(self, sim: Tracked, result: RunResult) -> bool:
        """A run a lost node cut short (``NodeLost``; recorded already): its run row marked
        ``requeued``, its job handed back to its source with what to resume from (its case,
        the iterations done), launched again as soon as there is room. False (nothing done)
        for any other end."""
        if result.failure != FailureCode.NODE_LOST.value or sim.staged is None:
            return False
        ctx, job = self.ctx, sim.job
        before = job.resume
        resume = Resume(
            staged=sim.staged, iterations_at_loss=result.iterations, lost_run_id=sim.run_id,
            why=result.message or "", losses=(before.losses + 1) if before else 1,
            iterations_lost=int(sim.resumed.get("iterations_lost_total", 0)),
        )  # fmt: skip
        message = (f"{result.message}; requeued at iteration {result.iterations} to resume "
                   "from its last written time")  # fmt: skip
        assert sim.run_id is not None
        ctx.store.requeue_run(sim.run_id, message, FailureCode.NODE_LOST.value)
        ctx.sims.pop(sim.sim_id, None)
        ctx.requeued.pop(job.queue_id, None)  # (no back-off: its node is gone, not full)
        ctx.jobs.requeued(replace(job, resume=resume), Failure(FailureCode.NODE_LOST, message))
        ctx.event(sim.run_id, "node-lost", queue_id=job.queue_id, sim=sim.sim_id,
                  code=FailureCode.NODE_LOST.value, iterations=result.iterations,
                  losses=resume.losses, reason=message)  # fmt: skip
        return True


def resumed_facts(resume: Resume, staged: StagedCase) -> dict[str, object]:
    """What a run resumed after a lost node records (its run's options, its event, its
    Simulation's status): where it starts again, the iterations lost (done after the write
    it resumes from and before the loss: done again; nothing before that write is)."""
    lost = resume.lost_now(staged)
    return {
        "resumed_from": staged.resumed_from or "start",
        "start_iterations": staged.start_iterations,
        "iterations_at_loss": resume.done_at_loss(staged),
        "iterations_lost": lost,
        "iterations_lost_total": resume.iterations_lost + lost,
        "node_losses": resume.losses,
        "lost_run_id": resume.lost_run_id,
    }


def resumed_reason(resume: Resume, staged: StagedCase) -> str:
    where = f"time {staged.resumed_from}" if staged.resumed_from else "its start (nothing written)"
    return (
        f"resumed from {where} after a lost node: {resume.done_at_loss(staged)} iterations "
        f"done, {staged.start_iterations} kept, {resume.lost_now(staged)} lost"
    )
