"""From a claimed job to running ranks: stage, stage ahead, launch, adopt, requeue.

The loop's applier of `StageJob` and `Launch` (`rankpack.controller.loop` calls it).
`Starter.stage` claims the job the policy stages and asks the backend to stage its case
(asynchronous: a staging simulation never blocks the others); once the backend reports it
staged (`progress`), the decision step of that tick launches it (`Launch`, decided by
`rankpack.controller.staged`: its requests, nodes and wait mode) and `launch` applies that
as it is: the run row, the backend spec. `prestage` stages the head of the queue ahead of
its launch while others run. `adopt` follows a simulation an earlier controller process
launched. A job that cannot be staged is recorded as a `StageFailure` with its code
(`StageFailed`, `NotACase`, `CaseNotConfined`); a launch the backend refuses ends the
simulation through the loop (`LaunchFailed` or the backend's code, `SolverNotAllowed`),
but one refused for a reason that passes (`LaunchRefused`: the namespace's quota, taken by
another tenant between plan and create) is undone and its job handed back to its source
(`JobSource.requeued`), to be launched again after a back-off. A run a lost node cut short
(``NodeLost``) is requeued too (`rankpack.controller.requeue`), with what to resume from (`Resume`):
staged again from its last complete write, not from the start, and the iterations lost
reported.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rankpack.backend.protocol import (
    BackendError,
    LaunchFailed,
    LaunchRefused,
    RankResources,
    ShimSpec,
    SimObservation,
    SimPhase,
    SimSpec,
    StagedCase,
    StageSpec,
)
from rankpack.case.openfoam import rank_env
from rankpack.case.staging import failure_code
from rankpack.controller import waits
from rankpack.controller.jobs import Adopted, Job
from rankpack.controller.learned import start_of
from rankpack.controller.observing import Observer
from rankpack.controller.outcomes import new_run
from rankpack.controller.requeue import Requeue, resumed_facts, resumed_reason
from rankpack.controller.tracked import LoopContext, Tracked
from rankpack.controller.views import StageFailure
from rankpack.core.actions import Launch, WaitChoice
from rankpack.core.failures import Failure, FailureCode
from rankpack.core.results import WaitRecord
from rankpack.errors import UserError
from rankpack.plan.images import mpi_refusal, solvers_for
from rankpack.plan.submission import MPIS


class Starter:
    def __init__(
        self, ctx: LoopContext, observer: Observer, end: Callable[[Tracked, Failure], None]
    ) -> None:
        self.ctx = ctx
        self.observer = observer
        self.end = end
        """Ends a simulation whose launch failed (the loop records it)."""
        self.requeue = Requeue(ctx)
        """Hands a job back to its source (a launch refused for quota, a lost node)."""
        self.prestaged: dict[int, str] = {}
        """queue id -> sim id of a case staged ahead of its launch (see `prestage`)."""
        self.prestaged_at: dict[int, float] = {}
        """queue id -> loop time its staging ahead began."""
        self.prestaged_done: dict[int, float] = {}
        """queue id -> loop time its staging ahead was seen done (staged or failed)."""

    # -- staging -------------------------------------------------------------------------

    def stage(
        self,
        job: Job,
        reason: str,
        request_millis: tuple[int, ...] = (),
        nodes: tuple[str, ...] = (),
    ) -> None:
        """The policy's `StageJob`: claim the job, stage it (or take what was staged ahead);
        ``nodes``: each rank's node, as the policy placed it (empty: none decided)."""
        ctx = self.ctx
        sub = job.submission
        wait_setting = waits.setting(sub.wait, ctx.settings.wait_mode)  # before anything starts
        if not ctx.jobs.claim(job):
            ctx.event(None, "launch-skipped", queue_id=job.queue_id,
                      reason="another session claimed it first")  # fmt: skip
            return
        ahead = self.prestaged.pop(job.queue_id, None)
        began = self.prestaged_at.pop(job.queue_id, ctx.now()) if ahead else ctx.now()
        done = self.prestaged_done.pop(job.queue_id, None) if ahead else None
        sim_id = ahead or self._start_staging(job)
        if sim_id is None:
            return
        plan, found = self.observer.plan(sub)
        if len(request_millis) == plan.n_ranks:
            ranks = tuple(
                replace(r, cpu_millis=m) for r, m in zip(plan.ranks, request_millis, strict=True)
            )
            plan = replace(plan, ranks=ranks)
        placed = nodes if len(nodes) == plan.n_ranks else ()
        ctx.sims[sim_id] = Tracked(
            job=job, sim_id=sim_id, plan=plan, queued_s=ctx.now(),
            wait_setting=wait_setting, learned_duty=found.duty if found else (), nodes=placed,
            mpi=sub.mpi or ctx.settings.mpi, start=start_of(sub, found),
            learned_from=found.run_id if found else None, staging_from_s=began,
            staged_at_s=done,
        )  # fmt: skip
        ctx.event(None, "stage", queue_id=job.queue_id, case=sub.case, sim=sim_id, reason=reason,
                  **({"staged_ahead": True} if ahead else {}),
                  **({"nodes": list(placed)} if placed else {}))  # fmt: skip
        if found is not None:
            ctx.event(None, "learned-sizes", queue_id=job.queue_id, sim=sim_id,
                      from_run=found.run_id, source=found.source,
                      request_millis=list(found.request_millis),
                      reason=found.describe())  # fmt: skip
        if ahead:  # staged already (or still staging): launch now, not at the next tick
            self.progress(ctx.sims[sim_id], ctx.backend.observe(sim_id))

    def _start_staging(self, job: Job, failures_are_final: bool = True) -> str | None:
        """Ask the backend to stage ``job``'s case; its sim id, or None if it was refused
        (recorded as the job's failure when ``failures_are_final``)."""
        sub = job.submission
        sim_id = f"s{uuid.uuid4().hex[:10]}"
        spec = StageSpec(
            sim_id=sim_id,
            case=sub.case,
            n_ranks=sub.n_ranks,
            runs_root=job.runs_root or self.ctx.settings.runs_root,
            iterations=sub.iterations,
            decompose=sub.decompose,
            decompose_weights=sub.decompose_weights or sub.weights,
            center=sub.center,
            workdir=Path(sub.workdir) if sub.workdir else None,
            confined=self.ctx.settings.confine_staging,
            scan=self.ctx.settings.case_scan,
            volume=self._volume(job),
            case_root=job.case_root,
            namespace=job.namespace,
            resume=job.resume.staged if job.resume is not None else None,
            image=sub.image or self.ctx.settings.image,
            pull_secrets=sub.pull_secrets,
        )
        try:
            self.ctx.backend.stage(spec)
        except (UserError, BackendError) as exc:
            if failures_are_final:
                code = failure_code(exc) if isinstance(exc, UserError) else None
                self._stage_failed(job, str(exc), code or FailureCode.STAGE_FAILED)
            return None
        return sim_id

    def _volume(self, job: Job) -> str | None:
        """Where ``job``'s run directory lives in its pods: its own spec's, its namespace's,
        else the loop's."""
        return job.submission.volume or job.volume or self.ctx.settings.volume

    def _stage_failed(self, job: Job, reason: str, code: FailureCode) -> None:
        ctx = self.ctx
        ctx.tally.stage_failures.append(StageFailure(job.queue_id, job.submission.case, reason,
                                                     code))  # fmt: skip
        ctx.jobs.finished(job, "failed", reason, code)
        ctx.event(None, "launch-failed", queue_id=job.queue_id, reason=reason, code=code.value)

    def progress(self, sim: Tracked, obs: SimObservation) -> None:
        """A simulation in staging, as observed: once staged, it waits for the decision
        step's `Launch` (this tick's); or record why its case could not be staged."""
        ctx = self.ctx
        if obs.phase is SimPhase.STAGED and obs.staged is not None:
            if sim.staged is None:
                self._staged(sim, obs.staged)
        elif obs.phase is SimPhase.FAILED:
            ctx.backend.release(sim.sim_id)
            del ctx.sims[sim.sim_id]
            reason = obs.stage_error or obs.reason or "staging failed"
            self._stage_failed(sim.job, reason, obs.failure or FailureCode.STAGE_FAILED)

    def prestage(self, pending: list[Job]) -> None:
        """Stage the queue's head ahead while simulations run (`LoopSettings.prestage`);
        release what was staged ahead for jobs no longer at the head (cancelled, claimed
        by another controller) or when the loop ends (``pending`` empty). ``pending`` is
        the tick's queue: the jobs this tick staged or failed are not its head."""
        ctx = self.ctx
        taken = {s.job.queue_id for s in ctx.sims.values()}
        taken |= {f.queue_id for f in ctx.tally.stage_failures}
        waiting = [j for j in pending if j.queue_id not in taken]
        only = ctx.settings.controller.launch_staged_only
        # launching only what was staged ahead: a window of the queue, also with nothing
        # running; else the head, while others run
        n = ctx.settings.controller.max_starting if only else 1
        active = ctx.settings.prestage and (only or bool(ctx.sims))
        heads = waiting[:n] if active else []
        keep = {j.queue_id for j in heads}
        for qid in [q for q in self.prestaged if q not in keep]:
            self.prestaged_at.pop(qid, None)
            self.prestaged_done.pop(qid, None)
            with contextlib.suppress(BackendError):
                ctx.backend.release(self.prestaged.pop(qid))
        for job in heads:
            if job.queue_id in self.prestaged:
                self._ahead_done(job.queue_id, only)
                continue
            sim_id = self._start_staging(job, failures_are_final=False)
            if sim_id is not None:  # a refusal is met again, and recorded, at its launch
                self.prestaged[job.queue_id] = sim_id
                self.prestaged_at[job.queue_id] = ctx.now()
            elif only and ctx.jobs.claim(job):  # never launched otherwise: record it now
                self._start_staging(job)

    def _ahead_done(self, queue_id: int, only: bool) -> None:
        """Note when a case staged ahead is done (its staging's end, for the session's
        staged-ahead seconds); not where the policy observes them itself (``only``)."""
        if only or queue_id in self.prestaged_done:
            return
        try:
            phase = self.ctx.backend.observe(self.prestaged[queue_id]).phase
        except BackendError:
            return
        if phase in (SimPhase.STAGED, SimPhase.FAILED):
            self.prestaged_done[queue_id] = self.ctx.now()

    # -- launching -----------------------------------------------------------------------

    def _staged(self, sim: Tracked, staged: StagedCase) -> None:
        """Its case is staged: what the staging says (the solver, warnings, where a resumed
        run starts again); the decision step launches it on this tick."""
        ctx = self.ctx
        sub = sim.job.submission
        if sim.staged_at_s is None:
            sim.staged_at_s = ctx.now()
        if sub.solver and sub.solver != staged.solver:
            ctx.event(None, "solver", sim=sim.sim_id, queue_id=sim.job.queue_id,
                      reason=f"{sub.solver} as submitted instead of the case's application "
                      f"{staged.solver}")  # fmt: skip
            # (staging listed the case's application's libraries, not this one's)
            staged = replace(staged, solver=sub.solver, mpi=None)
        if sub.mpi is None and staged.mpi in MPIS:  # not said: the MPI its solver links
            sim.mpi = staged.mpi
        sim.staged = staged
        for warning in staged.warnings:
            ctx.event(None, "warning", sim=sim.sim_id, reason=warning)
        resume = sim.job.resume
        if resume is not None:
            sim.resumed = resumed_facts(resume, staged)
            sim.parser.state.iterations = staged.start_iterations  # its log counts on
            ctx.event(None, "resumed", queue_id=sim.job.queue_id, sim=sim.sim_id,
                      **sim.resumed, reason=resumed_reason(resume, staged))  # fmt: skip

    def launch(self, action: Launch) -> None:
        """The decision step's `Launch` of a staged simulation, applied as it is: its
        requests, nodes and wait mode."""
        ctx = self.ctx
        sim = ctx.sims.get(action.sim_id)
        if sim is None or sim.launched or sim.staged is None:
            return
        staged, sub = sim.staged, sim.job.submission
        self._changes(sim, action)
        sim.run_id = new_run(ctx, sim, staged)
        ctx.jobs.started(sim.job, sim.run_id, sim.sim_id, staged)
        sim.usages = [[] for _ in sim.plan.ranks]
        self._wait(sim, action.wait)
        spec = self._spec(sim)
        sim.t0 = ctx.backend.clock()
        sim.started_s = ctx.now()
        s = ctx.settings
        allowed = None if s.solvers is None else solvers_for(sub.image, s.solvers,
                                                              s.image_solvers)  # fmt: skip
        if allowed is not None and staged.solver not in allowed:
            sim.end_t = sim.t0
            self.end(sim, Failure(FailureCode.SOLVER_NOT_ALLOWED, (
                f"launch failed: {staged.solver!r} (the case's application) is not an allowed "
                "solver; ask the admin to allow it (rankpack operator --solver)"
            )))  # fmt: skip
            return
        refusal = mpi_refusal(sim.mpi, staged.mpi, staged.solver)
        if refusal is not None:
            sim.end_t = sim.t0
            self.end(sim, Failure(refusal.code, f"launch failed: {refusal.message}"))
            return
        decided_unix = time.time()
        try:
            ctx.backend.launch(spec)
        except LaunchRefused as exc:
            self.requeue.refused(sim, exc)
            return
        except (BackendError, UserError) as exc:
            sim.end_t = sim.t0
            code = exc.code if isinstance(exc, LaunchFailed) else FailureCode.LAUNCH_FAILED
            self.end(sim, Failure(code, f"launch failed: {exc}"))
            return
        ctx.requeued.pop(sim.job.queue_id, None)
        # Every rank's counter is 0 at launch: the CPU-seconds integral starts there, so
        # start-up before the first sample is counted (short runs are mostly start-up).
        sim.times.append(0.0)
        for series in sim.usages:
            series.append(0)
        ctx.event(
            sim.run_id, "launch", queue_id=sim.job.queue_id, case=sub.case, sim=sim.sim_id,
            request_millis=[r.cpu_millis for r in sim.plan.ranks],
            wait_mode=action.wait.mode, wait_reason=action.wait.reason, start=sim.start,
            **({"nodes": list(sim.nodes)} if sim.nodes else {}),
            decided_unix=round(decided_unix, 3),
            launch_call_s=round(ctx.backend.clock() - sim.t0, 3),
        )  # fmt: skip

    def _changes(self, sim: Tracked, action: Launch) -> None:
        """Its requests and nodes as the decision gave them; an event per change."""
        for change in action.changes:
            what: dict[str, object] = (
                {"request_millis": list(change.request_millis)}
                if change.kind == "launch-fitted" else {"nodes": list(change.nodes)}
            )  # fmt: skip
            self.ctx.event(None, change.kind, queue_id=sim.job.queue_id, sim=sim.sim_id,
                           **what, reason=change.reason)  # fmt: skip
        if len(action.request_millis) == sim.plan.n_ranks and action.request_millis != tuple(
            r.cpu_millis for r in sim.plan.ranks
        ):
            ranks = tuple(
                replace(r, cpu_millis=m)
                for r, m in zip(sim.plan.ranks, action.request_millis, strict=True)
            )
            sim.plan = replace(sim.plan, ranks=ranks)
        sim.nodes = action.nodes

    def _wait(self, sim: Tracked, choice: WaitChoice) -> None:
        """Its ranks' wait mode and the MPI library's idle yield to match."""
        sim.idle_yield = choice.idle_yield
        sim.wait_mode = choice.mode if self.ctx.settings.shim else None
        sim.waits.append(
            WaitRecord(round(self.ctx.now(), 3), choice.mode, choice.reason, choice.ranks)
        )

    def _spec(self, sim: Tracked) -> SimSpec:
        assert sim.staged is not None
        s, staged = self.ctx.settings, sim.staged
        mpi = sim.mpi
        return SimSpec(
            sim_id=sim.sim_id,
            case_dir=staged.run_dir,
            command=(staged.solver, "-parallel"),
            ranks=tuple(RankResources(r.cpu_millis, r.limit_millis) for r in sim.plan.ranks),
            log_path=staged.log_path,
            env={**rank_env(), **waits.mpi_idle_env(sim.idle_yield)},
            mpi=mpi,
            shim=(ShimSpec(sim.wait_mode or "spin", mpi) if s.shim else None),
            image=sim.job.submission.image or s.image,
            pull_secrets=sim.job.submission.pull_secrets,
            volume=self._volume(sim.job),
            namespace=sim.job.namespace,
            labels={**self.ctx.settings.sim_labels, "rankpack.dev/run-id": str(sim.run_id)},
            rank_nodes=sim.nodes,
        )

    def adopt(self, adopted: Adopted) -> None:
        """Take over a simulation an earlier controller process launched (its job source
        knows it as running): the backend follows it again, and it ends as if launched here.

        The controller's memory of it starts afresh (warm-up, then profiling), so it may be
        sized again; resizes recorded before are kept, none is counted twice. Raises
        BackendError (e.g. UnknownSimulation) if the backend no longer holds it.
        """
        ctx = self.ctx
        job, staged = adopted.job, adopted.staged
        setting = waits.setting(job.submission.wait, ctx.settings.wait_mode)
        sim = Tracked(job=job, sim_id=adopted.sim_id, plan=job.submission.plan(), queued_s=0.0,
                      wait_setting=setting, mpi=job.submission.mpi or ctx.settings.mpi)  # fmt: skip
        sim.staged = staged
        sim.parser.state.iterations = staged.start_iterations  # (a resumed run's log counts on)
        if adopted.run_id is not None and ctx.store.take_over_run(adopted.run_id):
            sim.run_id = adopted.run_id
            # resizes settled before are the run's: counted once, never again
            sim.resizes = list(ctx.store.get_run(sim.run_id).resizes)
        else:
            sim.run_id = new_run(ctx, sim, staged)
            ctx.jobs.started(job, sim.run_id, sim.sim_id, staged)
        sim.usages = [[] for _ in sim.plan.ranks]
        # What the earlier process last chose is not known: set what the rule gives now, so
        # what the ranks do is known; the policy switches it from there.
        beside = self.observer.beside(sim.sim_id)
        requests = tuple(r.cpu_millis for r in sim.plan.ranks)
        self._wait(sim, waits.at_launch(beside, sim.wait_setting, requests, sim.nodes,
                                        sim.mpi_yields))  # fmt: skip
        ctx.backend.adopt(sim.sim_id, self._spec(sim))
        if sim.wait_mode is not None:
            try:
                ctx.backend.set_wait_mode(sim.sim_id, sim.wait_mode)
            except BackendError as exc:
                ctx.event(sim.run_id, "wait-mode-failed", mode=sim.wait_mode,
                          reason=f"adopted: {exc}")  # fmt: skip
        sim.t0 = ctx.backend.clock() - adopted.elapsed_s
        sim.started_s = ctx.now() - adopted.elapsed_s
        sim.shared_s = None  # what it shared under the earlier controller is not known
        ctx.sims[sim.sim_id] = sim
        ctx.event(sim.run_id, "adopted", queue_id=job.queue_id, sim=sim.sim_id,
                  reason=f"launched by an earlier controller {adopted.elapsed_s:.0f} s ago; "
                  "followed again")  # fmt: skip
