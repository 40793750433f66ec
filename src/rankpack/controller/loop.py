"""The one control loop: policy x backend x clock, for `rankpack run` and `multiplex` alike.

Every tick (about once a second, earlier when the backend reports an event) the loop

1. observes the simulations it holds through the backend (phase, per-rank counters, the
   shim's duty counters, new solver-log text, the state of in-flight resizes): every one
   with something under way, and the steady others in turn within a budget of ranks
   (`rankpack.controller.schedule`; all of them on a cluster of some hundred ranks),
2. records samples, resizes, restarts and ends in the store
   (`rankpack.controller.recording`),
3. builds `Observations` (`rankpack.controller.observing`) and calls the pure decision step
   `policy.decide`,
4. applies the actions: `Launch` starts a simulation the loop found staged, with the
   requests, nodes and wait mode the decision gave it; `StageJob` claims the queue entry and
   asks the backend to *stage* it (asynchronous: a staging simulation never blocks the
   others; it is launched by the decision of the tick that finds it staged,
   `rankpack.controller.launching`), `Resize` asks the backend for an
   in-place resize whose outcome is followed in later observations
   (`rankpack.controller.resizes`), `SetWaitMode` asks the backend to switch how the ranks
   wait in MPI (live; refused switches are asked for again on the next tick), `Note` is
   recorded as an event,
5. waits on the backend's clock for the next event of any simulation.

The policy decides, the loop applies. `rankpack run` is a queue of one (`OneJob`) with the
same loop; `rankpack multiplex` reads the store's queue (`StoreQueue`,
`rankpack.controller.jobs`). A simulation that ends is recorded by
`rankpack.controller.outcomes`; what a display shows is in `rankpack.controller.views`. The
loop owns no backend-specific notion: cgroups, pods, pid files and record files are the
backends' business.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import overload

from rankpack.backend.protocol import Backend, BackendError, SimObservation, SimPhase
from rankpack.controller.decision import Decision
from rankpack.controller.jobs import Adopted, Job, JobSource
from rankpack.controller.launching import Starter
from rankpack.controller.observing import Observer
from rankpack.controller.outcomes import Ending, outcome, run_result
from rankpack.controller.policy import decide
from rankpack.controller.recording import Recorder
from rankpack.controller.resizes import Resizes
from rankpack.controller.schedule import Changes, Schedule
from rankpack.controller.tracked import LoopContext, LoopSettings, Tracked
from rankpack.controller.views import (
    Display,
    LoopResult,
    NullDisplay,
    RankView,
    SimView,
)
from rankpack.core.actions import Action, Launch, Note, Resize, SetWaitMode, StageJob
from rankpack.core.failures import Failure
from rankpack.core.results import WaitRecord
from rankpack.store import Store

STOPPED_BY_USER = "stopped by the user (Ctrl-C or SIGTERM)"
WITHDRAWN = "stopped: its job was withdrawn (its Simulation was deleted)"


class ControlLoop:
    def __init__(
        self,
        backend: Backend,
        store: Store,
        jobs: JobSource,
        settings: LoopSettings,
        *,
        display: Display | None = None,
        stop: threading.Event | None = None,
        t0: float | None = None,
    ) -> None:
        self.ctx = LoopContext(
            backend, store, jobs, settings, backend.clock() if t0 is None else t0,
            stop=stop or threading.Event(),
        )  # fmt: skip
        self.display = display or NullDisplay()
        self.resizes = Resizes(self.ctx)
        self.observer = Observer(self.ctx, self.resizes)
        self.recorder = Recorder(self.ctx, self.resizes)
        self.starter = Starter(self.ctx, self.observer, self._launch_failed)
        self.wait_failed: set[tuple[str, str]] = set()
        """(sim, mode) switches refused once (recorded once; asked for again every tick)."""
        self.schedule = Schedule(settings.observe_ranks_per_tick, settings.observe_max_age_s)
        self._rank_views: dict[str, tuple[SimObservation, tuple[RankView, ...]]] = {}
        self.collector = Collector()

    @property
    def sims(self) -> dict[str, Tracked]:
        return self.ctx.sims

    def now(self) -> float:
        return self.ctx.now()

    def adopt(self, adopted: Adopted) -> None:
        """Take over a simulation an earlier controller process launched
        (`Starter.adopt`)."""
        self.starter.adopt(adopted)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> LoopResult:
        ctx = self.ctx
        status = "completed"
        self.collector.start()
        try:
            while True:
                self.recorder.count_shared()
                self._observe_all()
                self._end_withdrawn()
                self.resizes.retry_due()
                self.resizes.release_held()
                pending = ctx.jobs.pending()
                if not pending and not ctx.sims:
                    break
                obs = self.observer.observations(pending, self.starter.prestaged)
                decision = decide(obs, ctx.state, ctx.settings.controller)
                ctx.state = decision.state
                self._apply_all(decision.actions, pending)
                self.starter.prestage(pending)
                self.recorder.ticked()
                ctx.tally.max_seen = max(ctx.tally.max_seen, len(ctx.sims))
                ctx.jobs.heartbeat([s.job for s in ctx.sims.values()])
                self.display.update(obs.now_s, _Views(self._views))
                if ctx.stop.is_set():
                    status = "interrupted"
                    break
                self.collector.between_ticks()
                ctx.backend.wait(ctx.settings.tick_s)
                if ctx.stop.is_set():
                    status = "interrupted"
                    break
        except KeyboardInterrupt:
            status = "interrupted"
        finally:
            self.collector.stop()
            self.starter.prestage([])  # never launched: their copies hold no results
            leave = ctx.settings.leave_running
            for sim in list(ctx.sims.values()):
                if leave and sim.running:
                    ctx.flush(sim)  # it runs on; the next controller adopts it
                    ctx.sims.pop(sim.sim_id, None)
                elif leave and sim.launched:
                    self._end(sim)  # it ended by itself: recorded as it ended
                else:
                    self._end(sim, Ending(stopped=STOPPED_BY_USER))
            self.display.close()
        return ctx.tally.result(status)

    def _end_withdrawn(self) -> None:
        """Jobs their owner took back (a deleted Simulation): stopped and released now,
        recorded as interrupted."""
        gone = self.ctx.jobs.withdrawn()
        for sim in [s for s in self.sims.values() if s.job.queue_id in gone]:
            self.ctx.event(sim.run_id, "withdrawn", sim=sim.sim_id, queue_id=sim.job.queue_id)
            self._end(sim, Ending(stopped=WITHDRAWN))

    # -- observing -------------------------------------------------------------------------

    def _observe_all(self) -> None:
        self.recorder.pace()
        urgent, active = self._urgent()
        for sim in self.schedule.pick(self.sims, urgent, active, self.now()):
            obs = self.ctx.backend.observe(sim.sim_id)
            if not sim.launched:
                self.starter.progress(sim, obs)
                continue
            self.recorder.record(sim, obs)
            if obs.phase.ended:
                self._end(sim)

    def _urgent(self) -> tuple[set[str], set[str]]:
        """The simulations to follow every tick, and those about to cross a threshold the
        policy acts on (`rankpack.controller.schedule`)."""
        ctx = self.ctx
        urgent = self.resizes.busy() | {sim_id for sim_id, _ in self.wait_failed}
        if isinstance(ctx.backend, Changes):
            urgent |= set(ctx.backend.changed())
        active: set[str] = set()
        for sim in self.sims.values():
            mem = ctx.state.sims.get(sim.sim_id)
            if sim.last is None or sim.last.phase.ended or not sim.readings_ok:
                urgent.add(sim.sim_id)
            elif (
                sim.last.phase is not SimPhase.RUNNING
                or mem is None
                or mem.stage not in ("sized", "fixed")
            ):
                active.add(sim.sim_id)
        return urgent, active

    # -- actions ---------------------------------------------------------------------------

    def _apply_all(self, actions: Sequence[Action], pending: list[Job]) -> None:
        """Carry out one decision's actions: decreases, then the others (a launch after the
        decreases that made room for it), then increases (held while a decrease is in
        flight, see `rankpack.controller.resizes`)."""
        for action in actions:  # what was staged starts first, as the decision saw it
            if isinstance(action, Launch) and action.sim_id in self.sims:
                self.starter.launch(action)
        grows = self.resizes.send_decreases([a for a in actions if isinstance(a, Resize)])
        for action in actions:
            if isinstance(action, StageJob):
                job = next((j for j in pending if j.queue_id == action.queue_id), None)
                if job is not None:
                    self.starter.stage(job, action.reason, action.request_millis,
                                       action.nodes)  # fmt: skip
            elif isinstance(action, Launch):  # staged ahead: launched once claimed (if ready)
                self.starter.launch(action)
            elif isinstance(action, SetWaitMode):
                self._set_wait_mode(action)
            elif isinstance(action, Note):
                self._note(action, pending)
        self.resizes.hold(grows)

    def _note(self, action: Note, pending: list[Job]) -> None:
        ctx = self.ctx
        sim = ctx.sims.get(action.sim_id) if action.sim_id else None
        coded: dict[str, object] = {"code": action.code} if action.code else {}
        if action.queue_id is not None:  # whose hold it is (the operator's Event names it)
            coded["queue_id"] = action.queue_id
        ctx.event(sim.run_id if sim else None, action.kind, reason=action.reason, **coded)
        held = next((j for j in pending if j.queue_id == action.queue_id), None)
        if held is not None and action.kind == "launch-held":
            ctx.jobs.held(held, action.code, action.reason)

    def _set_wait_mode(self, action: SetWaitMode) -> None:
        ctx = self.ctx
        sim = ctx.sims.get(action.sim_id)
        if sim is None or not sim.launched or sim.wait_mode == action.mode:
            return  # (the same mode: it was launched in it; the policy's memory now agrees)
        try:
            ctx.backend.set_wait_mode(sim.sim_id, action.mode)
        except BackendError as exc:
            # Nothing changed on the ranks: forget the decision, so the policy asks again
            # on the next tick (e.g. a rank had not published its record yet).
            mem = ctx.state.sims.get(sim.sim_id)
            if mem is not None:
                sims = {**ctx.state.sims, sim.sim_id: replace(mem, wait_mode=sim.wait_mode)}
                ctx.state = replace(ctx.state, sims=sims)
            if (sim.sim_id, action.mode) not in self.wait_failed:
                self.wait_failed.add((sim.sim_id, action.mode))
                why = f"{action.reason}; refused: {exc} (asked again next tick)"
                ctx.event(sim.run_id, "wait-mode-failed", mode=action.mode, reason=why)
            return
        previous = sim.wait_mode
        sim.wait_mode = action.mode
        sim.waits.append(WaitRecord(round(self.now(), 3), action.mode, action.reason, action.ranks))
        self.wait_failed.discard((sim.sim_id, action.mode))
        ctx.event(sim.run_id, "wait-mode", mode=action.mode, previous=previous,
                  reason=action.reason)  # fmt: skip

    # -- the end of a simulation ------------------------------------------------------------

    def _launch_failed(self, sim: Tracked, failure: Failure) -> None:
        self._end(sim, Ending(failure=failure))

    def _end(self, sim: Tracked, ending: Ending | None = None) -> None:
        ctx, ending = self.ctx, ending or Ending()
        if not sim.launched:
            ctx.backend.release(sim.sim_id)
            ctx.sims.pop(sim.sim_id, None)
            requeue = ending.stopped is not None and sim.job.queue_id
            ctx.jobs.finished(sim.job, "queued" if requeue else "failed")
            return
        try:
            if ending.stopped is not None and sim.end_t is None:
                ctx.backend.stop(sim.sim_id)
            if ending.failure is None:
                final = ctx.backend.observe(sim.sim_id)
                self.recorder.record(sim, final)
                if sim.end_t is None:
                    sim.end_t = final.t_s
            ctx.flush(sim)
        finally:
            ctx.backend.release(sim.sim_id)
        self.resizes.ended(sim)
        result = run_result(ctx, sim, ending)
        assert sim.run_id is not None
        ctx.store.finish_run(result)
        self.observer.forget(sim.job.submission)
        back = self.starter.requeue
        if ending.stopped is None and (back.lost(sim, result) or
                                       back.unschedulable(sim, result)):  # fmt: skip
            return  # a lost node cut it short, or no node took it: back in the queue
        ctx.tally.results.append(result)
        ctx.sims.pop(sim.sim_id, None)
        ctx.jobs.finished(sim.job, result.status, result=result)
        finished = self.now()
        ctx.event(result.id, "finished", status=result.status, iterations=result.iterations,
                  wall_s=round(result.wall_s, 3), reason=result.message or "",
                  **({"code": result.failure} if result.failure else {}))  # fmt: skip
        ctx.tally.outcomes.append(outcome(result, sim, finished))

    # -- display -----------------------------------------------------------------------------

    def _views(self) -> list[SimView]:
        views = []
        busy = self.resizes.busy()
        for gone in [i for i in self._rank_views if i not in self.sims]:
            del self._rank_views[gone]
        for sim in self.sims.values():
            mem = self.ctx.state.sims.get(sim.sim_id)
            if sim.last is None:
                stage = "staging" if sim.staged is None else "starting"
                ranks: tuple[RankView, ...] = ()
            else:
                stage = mem.stage if mem else "starting"
                ranks = self._ranks_view(sim, busy)
            views.append(
                SimView(
                    sim_id=sim.sim_id,
                    run_id=sim.run_id,
                    run_dir=str(sim.staged.run_dir) if sim.staged else None,
                    case=sim.staged.case_name if sim.staged else sim.job.submission.case,
                    stage=stage,
                    elapsed_s=(self.ctx.backend.clock() - sim.t0) if sim.launched else 0.0,
                    log=sim.parser.state,
                    expected_iterations=sim.staged.expected_iterations if sim.staged else 0,
                    ranks=ranks,
                    queue_id=sim.job.queue_id,
                    resizes=sum(1 for r in sim.resizes if r.status == "completed"),
                    wait=sim.waits[-1] if sim.waits else None,
                    running=sim.last is not None and sim.last.phase is SimPhase.RUNNING,
                )
            )
        return views

    def _ranks_view(self, sim: Tracked, busy: set[str]) -> tuple[RankView, ...]:
        """Its ranks' views: built again when it was observed again or a resize of it is
        under way."""
        assert sim.last is not None
        cached = self._rank_views.get(sim.sim_id)
        if cached is not None and cached[0] is sim.last and sim.sim_id not in busy:
            return cached[1]
        ranks = tuple(self._rank_view(sim, r.rank) for r in sim.last.ranks)
        self._rank_views[sim.sim_id] = (sim.last, ranks)
        return ranks

    def _rank_view(self, sim: Tracked, rank: int) -> RankView:
        assert sim.last is not None
        r = sim.last.ranks[rank]
        flight = self.resizes.inflight(sim.sim_id, r.rank)
        return RankView(
            rank=r.rank,
            request_millis=r.request_millis,
            limit_millis=r.limit_millis,
            cpu_cores=sim.cores[r.rank] if r.rank < len(sim.cores) else 0.0,
            nr_throttled=r.nr_throttled,
            duty=r.duty_window,
            allocated_millis=r.allocated.request_millis if r.allocated else None,
            restarts=r.restarts,
            resize=(
                str(r.resize.state)
                if flight is not None and r.resize and not r.resize.state.final
                else None
            ),
            resize_to_millis=flight.to_millis if flight is not None else None,
            resize_reason=r.resize.reason if r.resize and flight is not None else "",
            node=r.node,
        )


class Collector:
    """Python's older garbage generations collected between ticks, not inside one.

    A tick of ten thousand ranks makes a thousand rank observations that live until their
    simulation is observed again (some ten ticks): they reach the oldest generation, and
    its collections (every ~1.3 s at that size, each walking every object the process
    holds: 150 ms median, 370 ms at p99 on this shared machine, `bench/scale.py`) landed
    in whichever tick allocated last. While the loop runs, the interpreter collects only
    the youngest generation by itself; `between_ticks` collects the older ones when the
    interpreter's own thresholds say so (the counts it keeps), just before the loop waits
    for the next event: the same collections, in the time the loop waits anyway. The
    thresholds are restored when the loop ends; with collection disabled, or a threshold
    of 0, nothing changes."""

    def __init__(self) -> None:
        self.saved: tuple[int, int, int] | None = None
        self.collections = 0
        """Collections of the older generations done between ticks."""

    def start(self) -> None:
        threshold = gc.get_threshold()
        if self.saved is not None or not gc.isenabled() or len(threshold) != 3 or 0 in threshold:
            return
        self.saved = (threshold[0], threshold[1], threshold[2])
        gc.set_threshold(threshold[0], 1 << 30, 1 << 30)

    def between_ticks(self) -> None:
        if self.saved is None:
            return
        _, young, old = self.saved
        _, gen0_runs, gen1_runs = gc.get_count()
        if gen1_runs > old:
            gc.collect(2)
        elif gen0_runs > young:
            gc.collect(1)
        else:
            return
        self.collections += 1

    def stop(self) -> None:
        if self.saved is not None and gc.get_threshold()[1:] == (1 << 30, 1 << 30):
            gc.set_threshold(*self.saved)
        self.saved = None


class _Views(Sequence[SimView]):
    """A tick's views, built when a display first looks at them (a display that shows
    nothing costs nothing)."""

    def __init__(self, build: Callable[[], list[SimView]]) -> None:
        self._build = build
        self._views: list[SimView] | None = None

    def _all(self) -> list[SimView]:
        if self._views is None:
            self._views = self._build()
        return self._views

    def __len__(self) -> int:
        return len(self._all())

    @overload
    def __getitem__(self, index: int) -> SimView: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[SimView]: ...
    def __getitem__(self, index: int | slice) -> SimView | Sequence[SimView]:
        return self._all()[index]


def run_jobs(
    backend: Backend,
    store: Store,
    jobs: JobSource,
    settings: LoopSettings,
    *,
    display: Display | None = None,
    stop: threading.Event | None = None,
) -> LoopResult:
    """Drive ``jobs`` to the end on ``backend`` (the one entry point of every command)."""
    return ControlLoop(backend, store, jobs, settings, display=display, stop=stop).run()


def preview(backend: Backend, store: Store, jobs: JobSource, settings: LoopSettings) -> Decision:
    """The decision the loop would take first on ``jobs``, applying none of it (the dry run):
    the same observations as a real run (learned sizes, capacity, nodes)."""
    loop = ControlLoop(backend, store, jobs, settings)
    obs = loop.observer.observations(jobs.pending())
    return decide(obs, loop.ctx.state, settings.controller)
