"""The multiplexing controller's decision step: observations and memory in, actions out.

`decide(obs, state, settings)` is pure: no I/O, no clock (time is ``obs.now_s``), no
randomness. The control loop (`rankpack.controller.loop`) calls it about once a second,
applies the returned actions in order and keeps the returned state for the next call.
There is no action that stops or relaunches a rank: every CPU change is an in-place
`Resize` (zero restarts is a property of the action set, not a promise of this module).

Per simulation (seed 001 §5.4, the issue's pipeline):

* Memory. A simulation seen for the first time starts at stage ``warmup``, or
  ``scheduled`` when it carries a phase schedule, or ``sized`` (with those duty cycles)
  when it carries ``learned_duty`` from an earlier run of the same case. Memory of
  simulations that left ``obs.sims`` is dropped. Each step appends an ``(now_s,
  iterations)`` rate mark (a mark at the same ``now_s`` replaces the last one; a clock
  going back restarts the marks) and keeps the marks of the last ``rate_window_s``, at
  least the two newest.
* (A) warmup -> profiling when ``progress >= warmup_fraction`` or the simulation was
  launched ``warmup_max_s`` ago (a long run's start-up transient is over long before a
  tenth of it), ``iterations >= warmup_min_iterations`` and every rank has shim data. The
  window's start counters (compute, MPI, usage) are stored; a ``profile-start`` note is emitted.
* (B) profiling -> sized once ``now_s - profile_start_s >= profile_s``, or earlier once
  the window is ``profile_min_s`` long and covers ``profile_progress`` of the run. Per rank,
  duty = dcompute / (dcompute + dmpi) (1.0 when both are 0: conservative); compute CPU =
  duty x dusage / window, in millicores; target = max(floor, ceil(compute x headroom))
  (ceil with a 1e-6 tolerance so float noise does not add a millicore). The simulation's
  total may not exceed min(budget, its current total + the node's unrequested capacity):
  above it the allowed total is split in proportion to the targets (`proportional_millis`,
  floors kept, exact sum). Only ranks whose request changes get a ``Resize(kind="size")``.
  If even n x floor does not fit, the requests stay and a ``resize-skipped`` note says why.
  If a rank lost its shim data by the end of the window, the simulation goes back to
  warmup (``profile-restart`` note).
* Phases (seed 000 §3.2.3). A ``scheduled`` simulation skips (A), (B) and fairness. When
  its progress reaches the ``start_fraction`` of a phase past ``phase_index`` it jumps to
  the latest phase reached (never back) and its ranks get that phase's requests (a rank
  beyond the phase's list keeps its request), raised to the floor and capped like (B).
  A phase whose requests equal the current ones emits nothing but still advances.
* Resize ordering. Within one simulation, decreases are emitted before increases, and
  every total is checked against the requests left by the earlier actions of the step,
  so the sum of requests stays within capacity after every prefix of the action list
  (if it was within capacity before the step).
* Clean rates. Any Resize changes every co-located simulation's speed, so after a step
  that emits one, every simulation's rate marks restart from the current mark: fairness
  then waits until ``rate_window_s / 2`` of post-change data exists.

Across simulations:

* (D) Fairness, among >= 2 ``sized`` simulations with a progress rate (dprogress / dt
  over >= 2 marks spanning >= ``rate_window_s / 2``), and not while any simulation is
  ``profiling`` (its window must be clean). It acts when the slowest rate is below
  (1 - t) x the fastest, with t = ``fairness_threshold``, or t / 2 while an episode is
  engaged (hysteresis: once adjusted, continue until the gap is below half the
  threshold; the episode ends when it is). At most one simulation is adjusted per step:
  the slowest is raised to floor(total x (1 + step)) capped by its budget and the
  unrequested capacity; if that gives no increase (or a raise would reverse its last
  adjustment within 2 x cooldown) the fastest is lowered to max(ceil(total x (1 - step)),
  n x floor). The new total is split over the ranks in proportion to their current
  requests. A simulation in its ``fairness_cooldown_s`` is not adjusted, and when the
  slowest one is in cooldown nothing is (its last raise has not shown yet). The per-step
  bound (at most ``fairness_step`` of the simulation's total) is exact.
* (C) Launch, after (B) and (D): the launch gate (`rankpack.controller.gate`) stages the
  next simulations; a simulation found staged is launched first, before (A)
  (`rankpack.controller.staged`: its requests, nodes and wait mode).
* (E) Wait modes, last: ``auto`` simulations switch between spin and polite by where their
  ranks sit (`rankpack.controller.waits`).

Stale readings. A simulation any of whose ranks has ``readings_ok`` False (its node could
not be read: the node agent is away) gets no Resize and no SetWaitMode in that step: its
stage does not advance (a profiling window grows; the counters are cumulative, so sizing
once it is read again measures the whole window), fairness leaves it out, and the launch
gate does not pack while it is stale (a pack resizes every running simulation).

Not observed again. A snapshot observed for an earlier step (``observed_s`` before
``now_s``: on a large cluster the loop observes a steady simulation in turn, not every
tick) is not decided on again: its memory is kept as it is (no rate mark, no stage step, no
wait switch); it still counts for fairness (its rate from its marks), the gate and the
capacity. So a step's cost grows with the simulations observed for it.

A resize the backend could not apply (``failed``: not refused, e.g. the apiserver did not
answer) is asked for again after `retry_delay_s` (the loop keeps the count).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from rankpack.controller import pacing, staged, waits
from rankpack.controller.decision import (
    AUTO_LAUNCH_MODE,
    ControllerSettings,
    ControllerState,
    Decision,
    Observations,
    SimMemory,
    SimSnapshot,
    SimStage,
)
from rankpack.controller.gate import launch
from rankpack.controller.pacing import Pacer
from rankpack.controller.step import Step, has_shim
from rankpack.core.actions import Note, Resize, SetWaitMode, StageJob
from rankpack.plan.allocation import proportional_millis

__all__ = [
    "REQUEUE_DELAYS_S",
    "RETRY_DELAYS_S",
    "decide",
    "requeue_delay_s",
    "retry_delay_s",
    "within_bounds",
]

_EPS = 1e-6


def decide(obs: Observations, state: ControllerState, settings: ControllerSettings) -> Decision:
    """One controller step: the actions to apply now and the memory for the next step."""
    started, obs = staged.launches(obs, settings)
    failed: list[StageJob] = []
    if settings.launch_staged_only:
        # what is still staging ahead waits without holding others; a failed staging is
        # claimed now to record its failure (`ControllerSettings.launch_staged_only`)
        failed = [StageJob(queue_id=q.queue_id, reason="its case could not be staged")
                  for q in obs.queue if q.stage_failed]  # fmt: skip
        obs = replace(obs, queue=tuple(q for q in obs.queue if q.ready and not q.stage_failed))
    step = Step(obs=obs, settings=within_bounds(settings, obs))
    step.actions.extend(started)
    step.actions.extend(failed)
    pacer = Pacer.of(state, obs.now_s, settings)
    step.resize_room = lambda per_node: pacer.allows(
        _plus(per_node, pacing.per_node(_resizes(step), step))
    )
    step.queued(state.resize_queue)
    memory = {
        sim.sim_id: _with_mark(sim, state.sims.get(sim.sim_id), obs.now_s, settings)
        for sim in obs.sims
    }

    for sim in obs.sims:
        mem = memory[sim.sim_id]
        if not sim.readings_ok or not sim.fresh(obs.now_s):
            continue  # stale counters, or not observed again: its stage waits
        if mem.stage == "scheduled":
            memory[sim.sim_id] = _follow_phases(sim, mem, step)
        elif mem.stage == "warmup":
            memory[sim.sim_id] = _maybe_start_profiling(sim, mem, step)
        elif mem.stage == "profiling":
            memory[sim.sim_id] = _maybe_size(sim, mem, step)

    # fairness skips a step that already resized (its rates would be stale)
    fairness_engaged = _fairness(step, memory, state.fairness_engaged)
    if step.resized:
        memory = _restart_marks(obs, memory)

    gated = launch(step, memory, state)
    launched = {a.queue_id for a in step.actions if isinstance(a, StageJob)}
    launching = sum(q.n_ranks for q in obs.queue if q.queue_id in launched)
    _wait_modes(step, memory, launching)
    waiting = pacing.pace(step, state, pacer)
    stages = [a for a in step.actions if isinstance(a, StageJob)]
    step.actions.extend(staged.ahead(obs, stages, settings))
    resize_bucket, node_buckets = pacer.buckets()
    new_state = ControllerState(
        sims=memory,
        last_launch_s=gated.last_launch_s,
        launch_held=gated.launch_held,
        fairness_engaged=fairness_engaged,
        head_no_room=gated.head_no_room,
        launch_bucket=gated.launch_bucket,
        resize_queue=waiting,
        resize_bucket=resize_bucket,
        resize_node_buckets=node_buckets,
    )
    return Decision(state=new_state, actions=tuple(step.actions))


def _resizes(step: Step) -> list[Resize]:
    return [a for a in step.actions if isinstance(a, Resize)]


def _plus(a: Mapping[str | None, int], b: Mapping[str | None, int]) -> dict[str | None, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in a.keys() | b.keys()}


def within_bounds(settings: ControllerSettings, obs: Observations) -> ControllerSettings:
    """The settings with the floor raised to the least request a rank may have where it is
    placed (a LimitRange's ``min``: a resize below it is refused), never above the most."""
    floor = max(settings.floor_millis, obs.rank_min_millis)
    if obs.rank_max_millis is not None:
        floor = min(floor, obs.rank_max_millis)
    return settings if floor == settings.floor_millis else replace(settings, floor_millis=floor)


# --- memory ------------------------------------------------------------------------------


def _with_mark(
    sim: SimSnapshot, mem: SimMemory | None, now_s: float, settings: ControllerSettings
) -> SimMemory:
    if mem is not None and not sim.fresh(now_s):
        return mem  # not observed again since its last mark: nothing new to remember
    if mem is None:
        stage: SimStage = "warmup"
        duty: tuple[float, ...] = ()
        if sim.phases:
            stage = "scheduled"
        elif sim.sizing == "fixed":
            stage = "fixed"
        elif sim.learned_duty and len(sim.learned_duty) == len(sim.ranks):
            stage, duty = "sized", sim.learned_duty
        mem = SimMemory(stage=stage, duty=duty)
    marks = list(mem.rate_marks)
    if marks and marks[-1][0] > now_s:
        marks = []
    if marks and marks[-1][0] == now_s:
        marks.pop()
    marks.append((now_s, sim.iterations))
    return replace(mem, rate_marks=_prune(tuple(marks), now_s, settings.rate_window_s))


def _prune(
    marks: tuple[tuple[float, int], ...], now_s: float, window_s: float
) -> tuple[tuple[float, int], ...]:
    kept = tuple(m for m in marks if m[0] >= now_s - window_s)
    if len(kept) < 2:
        kept = marks[-2:]
    return kept


def _restart_marks(obs: Observations, memory: dict[str, SimMemory]) -> dict[str, SimMemory]:
    by_id = {s.sim_id: s for s in obs.sims}
    return {
        sid: replace(mem, rate_marks=((_seen_s(by_id[sid], obs.now_s), by_id[sid].iterations),))
        for sid, mem in memory.items()
    }


def _seen_s(sim: SimSnapshot, now_s: float) -> float:
    """When what ``sim`` shows was observed."""
    return now_s if sim.observed_s is None else min(now_s, sim.observed_s)


def _rate(sim: SimSnapshot, mem: SimMemory, settings: ControllerSettings) -> float | None:
    """Progress fraction per second over the rate marks, or None if not measurable yet."""
    marks = mem.rate_marks
    if len(marks) < 2 or sim.expected_iterations <= 0:
        return None
    (t0, i0), (t1, i1) = marks[0], marks[-1]
    span = t1 - t0
    if span <= 0 or span < settings.rate_window_s / 2:
        return None
    return (i1 - i0) / sim.expected_iterations / span


# --- (A) and (B): profiling and sizing ---------------------------------------------------


def _maybe_start_profiling(sim: SimSnapshot, mem: SimMemory, step: Step) -> SimMemory:
    s = step.settings
    now = step.obs.now_s
    if not (
        (sim.progress >= s.warmup_fraction or now - sim.started_s >= s.warmup_max_s)
        and sim.iterations >= s.warmup_min_iterations
        and sim.ranks
        and has_shim(sim)
    ):
        return mem
    step.actions.append(
        Note(
            sim_id=sim.sim_id,
            kind="profile-start",
            reason=(
                f"past warm-up (progress {sim.progress:.1%}, {sim.iterations} iterations, "
                f"{now - sim.started_s:.0f} s since launch): "
                f"profiling duty cycles for {s.profile_s:g} s or {s.profile_progress:.0%} of"
                f" the run, whichever is shorter (at least {s.profile_min_s:g} s)"
            ),
        )
    )
    return replace(
        mem,
        stage="profiling",
        profile_start_s=step.obs.now_s,
        profile_start=tuple((r.compute_ns or 0, r.mpi_ns or 0) for r in sim.ranks),
        profile_start_usage=tuple(r.usage_ns for r in sim.ranks),
        profile_start_progress=sim.progress,
    )


def _maybe_size(sim: SimSnapshot, mem: SimMemory, step: Step) -> SimMemory:
    s = step.settings
    now = step.obs.now_s
    if mem.profile_start_s is None:
        return replace(mem, stage="warmup")
    window_s = now - mem.profile_start_s
    profiled = sim.progress - mem.profile_start_progress
    if window_s < s.profile_s and (window_s < s.profile_min_s or profiled < s.profile_progress):
        return mem
    n = len(sim.ranks)
    if (
        not has_shim(sim)
        or len(mem.profile_start) != n
        or len(mem.profile_start_usage) != n
        or window_s <= 0
    ):
        step.actions.append(
            Note(
                sim_id=sim.sim_id,
                kind="profile-restart",
                reason="shim data or ranks changed during the profiling window; warming up again",
            )
        )
        return replace(
            mem, stage="warmup", profile_start_s=None, profile_start=(), profile_start_usage=()
        )

    duties: list[float] = []
    compute_millis: list[float] = []
    for r, (c0, m0), u0 in zip(sim.ranks, mem.profile_start, mem.profile_start_usage, strict=True):
        dc = max(0, (r.compute_ns or 0) - c0)
        dm = max(0, (r.mpi_ns or 0) - m0)
        duty = dc / (dc + dm) if dc + dm > 0 else 1.0
        du = max(0, r.usage_ns - u0)
        duties.append(duty)
        compute_millis.append(duty * du / (window_s * 1e6))
    wanted = [max(s.floor_millis, math.ceil(c * s.headroom - _EPS)) for c in compute_millis]
    targets, cap_note = _fit(sim, wanted, step)
    current = step.requests[sim.sim_id]
    reasons = [
        f"duty {d:.3f} over {window_s:g} s: compute {c:.0f}m x headroom {s.headroom:g}"
        + _tail(w, t, cur, cap_note)
        for d, c, w, t, cur in zip(duties, compute_millis, wanted, targets, current, strict=True)
    ]
    step.resize(sim, targets, "size", reasons)
    return replace(mem, stage="sized", duty=tuple(duties))


def _fit(sim: SimSnapshot, wanted: list[int], step: Step) -> tuple[list[int], str]:
    """``wanted`` capped to the most a rank may request (``rank_max_millis``), the
    simulation's budget and the node's unrequested capacity.

    Returns the targets and what the cap did, for the reasons ("" when nothing was capped).
    When even the floors do not fit, the requests stay as they are and a
    ``resize-skipped`` note says so. When the namespace's quota is what leaves no room for
    a grow (``capacity_bound``), a note with the code ``quota`` says so (the grow is held
    within the quota instead of being sent to be refused).
    """
    obs, notes = step.obs, []
    high = obs.rank_max_millis
    if high is not None and any(w > high for w in wanted):
        wanted = [min(w, high) for w in wanted]
        notes.append(f"ranks capped at {high}m by {obs.rank_bounds}")
    allowed = step.room_for(sim)
    if sum(wanted) <= allowed:
        return wanted, "; ".join(notes)
    floor = step.settings.floor_millis
    quota = bool(obs.capacity_bound) and allowed < sim.budget_millis
    if floor * len(wanted) > allowed:
        where = f"the budget and {obs.capacity_bound}" if quota else "the budget and the node"
        step.actions.append(
            Note(
                sim_id=sim.sim_id,
                kind="resize-skipped",
                reason=(
                    f"wanted {sum(wanted)}m but only {allowed}m fits {where},"
                    f" less than {len(wanted)} x the {floor}m floor: requests unchanged"
                ),
                code="quota" if quota else "",
            )
        )
        return list(step.requests[sim.sim_id]), ""
    if quota and sum(wanted) > step.total(sim.sim_id):
        step.actions.append(
            Note(
                sim_id=sim.sim_id,
                kind="resize-capped",
                reason=(
                    f"{sim.sim_id} wanted {sum(wanted)}m, {allowed}m fit: grows held within "
                    f"{obs.capacity_bound}"
                ),
                code="quota",
            )
        )
    notes.append(f"sum {sum(wanted)}m capped to {allowed}m")
    return proportional_millis([float(w) for w in wanted], allowed, floor), "; ".join(notes)


def _tail(wanted: int, target: int, current: int, cap_note: str) -> str:
    capped = f" ({cap_note}) -> {target}m" if target != wanted else ""
    return f" -> {wanted}m{capped} (was {current}m)"


def _follow_phases(sim: SimSnapshot, mem: SimMemory, step: Step) -> SimMemory:
    reached = [i for i, ph in enumerate(sim.phases) if sim.progress >= ph.start_fraction]
    if not reached or max(reached) <= mem.phase_index:
        return mem
    index = max(reached)
    phase = sim.phases[index]
    current = step.requests[sim.sim_id]
    floor = step.settings.floor_millis
    wanted = [
        max(floor, phase.request_millis[i]) if i < len(phase.request_millis) else current[i]
        for i in range(len(current))
    ]
    targets, cap_note = _fit(sim, wanted, step)
    reasons = [
        f"phase {index + 1}/{len(sim.phases)} from progress {phase.start_fraction:.1%}"
        f" (progress {sim.progress:.1%})" + _tail(w, t, cur, cap_note)
        for w, t, cur in zip(wanted, targets, current, strict=True)
    ]
    step.resize(sim, targets, "phase", reasons)
    return replace(mem, phase_index=index)


# --- (D) fairness ------------------------------------------------------------------------


def _fairness(step: Step, memory: dict[str, SimMemory], engaged: bool) -> bool:
    """Adjust at most one simulation; returns whether a fairness episode is engaged."""
    s = step.settings
    now = step.obs.now_s
    sized = [
        sim for sim in step.obs.sims if memory[sim.sim_id].stage == "sized" and sim.readings_ok
    ]
    if len(sized) < 2:
        return False
    if step.resized or any(m.stage == "profiling" for m in memory.values()):
        return engaged
    rated: list[tuple[float, SimSnapshot]] = []
    for sim in sized:
        rate = _rate(sim, memory[sim.sim_id], s)
        if rate is not None:
            rated.append((rate, sim))
    if len(rated) < 2:
        return engaged
    slow_rate, slow = min(rated, key=lambda x: x[0])
    fast_rate, fast = max(rated, key=lambda x: x[0])
    if fast_rate <= 0:
        return engaged
    gap = 1.0 - slow_rate / fast_rate
    threshold = s.fairness_threshold / 2 if engaged else s.fairness_threshold
    if gap < s.fairness_threshold / 2:
        return False
    if gap <= threshold:
        return engaged
    why = f"progress rate {slow_rate:.3g}/s is {gap:.1%} behind {fast_rate:.3g}/s"

    def cooling(sim: SimSnapshot) -> bool:
        last = memory[sim.sim_id].last_adjust_s
        return last is not None and now - last < s.fairness_cooldown_s

    def reverses(sim: SimSnapshot, sign: int) -> bool:
        m = memory[sim.sim_id]
        return (
            m.last_adjust_s is not None
            and m.last_adjust_sign == -sign
            and now - m.last_adjust_s < 2 * s.fairness_cooldown_s
        )

    if cooling(slow):
        return engaged
    if not reverses(slow, +1):
        total = step.total(slow.sim_id)
        new_total = min(math.floor(total * (1 + s.fairness_step)), step.room_for(slow))
        raised = f"{slow.sim_id}'s {why}: raised"
        if new_total > total and _adjust(step, memory, slow, new_total, +1, raised):
            return True
    if fast is slow or cooling(fast) or reverses(fast, -1):
        return engaged
    total = step.total(fast.sim_id)
    floor_total = s.floor_millis * len(fast.ranks)
    new_total = max(math.ceil(total * (1 - s.fairness_step)), floor_total)
    if new_total >= total:
        return engaged
    lowered = f"{slow.sim_id}'s {why}, no room to raise it: lowered"
    return _adjust(step, memory, fast, new_total, -1, lowered) or engaged


def _adjust(
    step: Step,
    memory: dict[str, SimMemory],
    sim: SimSnapshot,
    new_total: int,
    sign: int,
    why: str,
) -> bool:
    """Resize ``sim`` to ``new_total`` in proportion to its requests; False if floors forbid."""
    current = step.requests[sim.sim_id]
    total = sum(current)
    if step.settings.floor_millis * len(current) > new_total:
        return False
    weights = [float(max(1, r)) for r in current]
    targets = proportional_millis(weights, new_total, step.settings.floor_millis)
    high = step.obs.rank_max_millis
    if high is not None:
        targets = [min(t, high) for t in targets]  # a LimitRange's max: refused above it
        if targets == current:
            return False
        new_total = sum(targets)
    reason = f"fairness: {why} {sim.sim_id} from {total}m to {new_total}m in total"
    step.resize(sim, targets, "fairness", [reason] * len(targets))
    memory[sim.sim_id] = replace(
        memory[sim.sim_id], last_adjust_s=step.obs.now_s, last_adjust_sign=sign
    )
    return True


# --- (E) wait modes ----------------------------------------------------------------------


def _wait_modes(step: Step, memory: dict[str, SimMemory], launching: int) -> None:
    """Switch ``auto`` simulations between spin and polite by where their ranks sit
    (`rankpack.controller.waits`): polite where ranks outnumber a node's cores and are not
    all of one rank group of theirs.
    ``launching``: ranks of a simulation this step launches (not placed yet)."""
    obs = step.obs
    loads: Mapping[str, waits.NodeLoad] | None = None
    nodes = waits.nodes_of(obs)
    crowd = waits.others_crowd(obs, step.requested_millis)
    for sim in obs.sims:
        if (
            sim.wait != "auto"
            or sim.starting
            or not sim.ranks
            or not sim.fresh(obs.now_s)
            or not has_shim(sim)
            or not sim.readings_ok
        ):
            continue
        mem = memory[sim.sim_id]
        current = sim.wait_mode or mem.wait_mode or AUTO_LAUNCH_MODE
        if loads is None:  # the loads of every node, once per step (if any is asked for)
            loads = waits.node_loads(obs, launching)
        pods = [(r.node, r.pod) for r in sim.ranks]
        own = waits.grouped(pods, nodes, loads) if sim.mpi_yields else {}
        if waits.mode(sim.wait, sim.nodes, loads, nodes, crowd, own) == current:
            continue
        choice = waits.choose(sim.wait, [r.node for r in sim.ranks], loads, nodes, crowd, own)
        step.actions.append(
            SetWaitMode(
                sim_id=sim.sim_id,
                mode=choice.mode,
                reason=f"{choice.reason}: {current} -> {choice.mode}",
                ranks=choice.ranks,
            )
        )
        memory[sim.sim_id] = replace(mem, wait_mode=choice.mode)


# --- failed resizes ----------------------------------------------------------------------

RETRY_DELAYS_S = (2.0, 4.0, 8.0, 16.0, 30.0)
"""Back-off of a failed resize's retries; after the last one it is given up."""


def retry_delay_s(attempt: int) -> float | None:
    """When to ask again for a resize that failed after ``attempt`` retries (0: the first
    request failed); None: give it up."""
    return RETRY_DELAYS_S[attempt] if attempt < len(RETRY_DELAYS_S) else None


REQUEUE_DELAYS_S = (2.0, 4.0, 8.0, 16.0, 30.0)
"""Back-off of a launch the namespace's quota refused (the job waits in its queue); after
the last one it stays at the last (a launch is never given up for quota)."""


def requeue_delay_s(attempt: int) -> float:
    """How long a job whose launch was refused ``attempt`` + 1 times in a row waits before
    it may be launched again."""
    return REQUEUE_DELAYS_S[min(attempt, len(REQUEUE_DELAYS_S) - 1)]
