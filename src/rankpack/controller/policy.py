"""The multiplexing controller's decision step: observations and memory in, actions out.

`decide(obs, state, settings)` is pure: no I/O, no clock (time is ``obs.now_s``), no
randomness. The driver (`rankpack.controller.multiplex`) calls it about once a second,
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
* (A) warmup -> profiling when ``progress >= warmup_fraction``, ``iterations >=
  warmup_min_iterations`` and every rank has shim data. The window's start counters
  (compute, MPI, usage) are stored; a ``profile-start`` note is emitted.
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
* (C) Launch, after (B) and (D): at most one `Launch` per step, for ``obs.queue[0]``
  (FIFO), or - while the head does not fit (``no-room``) and has waited less than
  ``backfill_wait_s`` since it stopped fitting - the first of the next ``backfill_scan``
  simulations that would be launched by the same rules (backfill; after that wait nothing
  passes the head, so neither wide nor narrow simulations starve). With nothing running it
  launches at once, only held by the launch cooldown (a guard against a launch the
  observations do not show yet). Otherwise every running simulation must be ``sized`` or
  ``scheduled`` and have started its ranks (one still starting counts when it was sized
  from learned duty cycles, unless the launch needs a pack), fewer than ``max_concurrent``
  running, the cooldown over, the unrequested capacity >= the head's initial requests, and
  the throughput model must predict a gain: N = running count, R = max(ranks of the head
  and of the running simulations), one node of capacity / 1000 vCPUs, duty cycles = per
  rank index the mean of the running simulations' duties (a ``scheduled`` one uses its
  cumulative shim ratio, or 1.0 without shim data), padded with the overall mean to R;
  throughput(n) = n / slowdown(n) from `predict_from_duty_cycles`, and the launch needs
  throughput(N+1) >= (1 + ``min_predicted_gain``) x throughput(N). When the head is held
  back a ``launch-held`` note is emitted only when the reason code changes (``cooldown``,
  ``max-concurrent``, ``no-room``, ``no-gain``); waiting for a simulation in warmup or
  profiling (code ``measuring``) is silent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from rankpack.controller import waits
from rankpack.controller.observations import (
    AUTO_LAUNCH_MODE,
    Action,
    ControllerSettings,
    ControllerState,
    Decision,
    Launch,
    Note,
    Observations,
    QueuedSim,
    Resize,
    SetWaitMode,
    SimMemory,
    SimSnapshot,
    SimStage,
)
from rankpack.core.actions import ResizeKind
from rankpack.model.contention import ClusterShape, throughput
from rankpack.model.overlap import predict_from_duty_cycles
from rankpack.plan.allocation import proportional_millis

_EPS = 1e-6


def decide(obs: Observations, state: ControllerState, settings: ControllerSettings) -> Decision:
    """One controller step: the actions to apply now and the memory for the next step."""
    step = _Step(obs=obs, settings=settings)
    memory = {
        sim.sim_id: _with_mark(sim, state.sims.get(sim.sim_id), obs.now_s, settings)
        for sim in obs.sims
    }

    for sim in obs.sims:
        mem = memory[sim.sim_id]
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

    last_launch_s, launch_held, head_no_room = _launch(step, memory, state)
    launched = [a.queue_id for a in step.actions if isinstance(a, Launch)]
    head_ranks = next((q.n_ranks for q in obs.queue if q.queue_id in launched), 0)
    _wait_modes(step, memory, head_ranks)
    new_state = ControllerState(
        sims=memory,
        last_launch_s=last_launch_s,
        launch_held=launch_held,
        fairness_engaged=fairness_engaged,
        head_no_room=head_no_room,
    )
    return Decision(state=new_state, actions=tuple(step.actions))


# --- working state of one step -----------------------------------------------------------


@dataclass
class _Step:
    """The requests as they stand after the actions emitted so far in this step."""

    obs: Observations
    settings: ControllerSettings
    actions: list[Action] = field(default_factory=list)
    requests: dict[str, list[int]] = field(default_factory=dict)
    resized: bool = False

    def __post_init__(self) -> None:
        self.requests = {s.sim_id: [r.request_millis for r in s.ranks] for s in self.obs.sims}

    def unrequested(self) -> int:
        return self.obs.capacity_millis - sum(sum(r) for r in self.requests.values())

    def total(self, sim_id: str) -> int:
        return sum(self.requests[sim_id])

    def room_for(self, sim: SimSnapshot) -> int:
        """The most this simulation's requests may add up to after this step."""
        current = self.total(sim.sim_id)
        return min(sim.budget_millis, current + max(0, self.unrequested()))

    def resize(
        self,
        sim: SimSnapshot,
        targets: Sequence[int],
        kind: ResizeKind,
        reasons: Sequence[str],
    ) -> int:
        """Emit a Resize per rank whose request changes, decreases first; returns the count."""
        current = self.requests[sim.sim_id]
        changed = [i for i, t in enumerate(targets) if t != current[i]]
        changed.sort(key=lambda i: (targets[i] > current[i], i))
        for i in changed:
            self.actions.append(
                Resize(
                    sim_id=sim.sim_id,
                    rank=sim.ranks[i].rank,
                    request_millis=targets[i],
                    reason=reasons[i],
                    kind=kind,
                )
            )
            current[i] = targets[i]
        if changed:
            self.resized = True
        return len(changed)


# --- memory ------------------------------------------------------------------------------


def _with_mark(
    sim: SimSnapshot, mem: SimMemory | None, now_s: float, settings: ControllerSettings
) -> SimMemory:
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
        sid: replace(mem, rate_marks=((obs.now_s, by_id[sid].iterations),))
        for sid, mem in memory.items()
    }


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


def _has_shim(sim: SimSnapshot) -> bool:
    return all(r.compute_ns is not None and r.mpi_ns is not None for r in sim.ranks)


def _maybe_start_profiling(sim: SimSnapshot, mem: SimMemory, step: _Step) -> SimMemory:
    s = step.settings
    if not (
        sim.progress >= s.warmup_fraction
        and sim.iterations >= s.warmup_min_iterations
        and sim.ranks
        and _has_shim(sim)
    ):
        return mem
    step.actions.append(
        Note(
            sim_id=sim.sim_id,
            kind="profile-start",
            reason=(
                f"past warm-up (progress {sim.progress:.1%}, {sim.iterations} iterations): "
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


def _maybe_size(sim: SimSnapshot, mem: SimMemory, step: _Step) -> SimMemory:
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
        not _has_shim(sim)
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


def _fit(sim: SimSnapshot, wanted: list[int], step: _Step) -> tuple[list[int], str]:
    """``wanted`` capped to the simulation's budget and the node's unrequested capacity.

    Returns the targets and what the cap did, for the reasons ("" when nothing was capped).
    When even the floors do not fit, the requests stay as they are and a
    ``resize-skipped`` note says so.
    """
    allowed = step.room_for(sim)
    if sum(wanted) <= allowed:
        return wanted, ""
    floor = step.settings.floor_millis
    if floor * len(wanted) > allowed:
        step.actions.append(
            Note(
                sim_id=sim.sim_id,
                kind="resize-skipped",
                reason=(
                    f"wanted {sum(wanted)}m but only {allowed}m fits the budget and the node,"
                    f" less than {len(wanted)} x the {floor}m floor: requests unchanged"
                ),
            )
        )
        return list(step.requests[sim.sim_id]), ""
    return (
        proportional_millis([float(w) for w in wanted], allowed, floor),
        f"sum {sum(wanted)}m capped to {allowed}m",
    )


def _tail(wanted: int, target: int, current: int, cap_note: str) -> str:
    capped = f" ({cap_note}) -> {target}m" if target != wanted else ""
    return f" -> {wanted}m{capped} (was {current}m)"


def _follow_phases(sim: SimSnapshot, mem: SimMemory, step: _Step) -> SimMemory:
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


def _fairness(step: _Step, memory: dict[str, SimMemory], engaged: bool) -> bool:
    """Adjust at most one simulation; returns whether a fairness episode is engaged."""
    s = step.settings
    now = step.obs.now_s
    sized = [sim for sim in step.obs.sims if memory[sim.sim_id].stage == "sized"]
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
    step: _Step,
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
    reason = f"fairness: {why} {sim.sim_id} from {total}m to {new_total}m in total"
    step.resize(sim, targets, "fairness", [reason] * len(targets))
    memory[sim.sim_id] = replace(
        memory[sim.sim_id], last_adjust_s=step.obs.now_s, last_adjust_sign=sign
    )
    return True


# --- (C) launch --------------------------------------------------------------------------


def _launch(
    step: _Step, memory: dict[str, SimMemory], state: ControllerState
) -> tuple[float | None, str | None, tuple[int, float] | None]:
    """Launch the head of the queue, or backfill behind it, or say why not; returns
    (last_launch_s, launch_held, head_no_room)."""
    obs = step.obs
    if not obs.queue:
        return state.last_launch_s, None, None
    head = obs.queue[0]
    code, reason = _hold_reason(step, memory, state, head)
    if code == "pack":
        packed = _pack(step, head, reason)
        if packed is not None:
            step.actions.append(Launch(queue_id=head.queue_id, reason=reason,
                                       request_millis=packed))  # fmt: skip
            return obs.now_s, None, None
        code, reason = "no-room", f"{reason}; but the floors leave no room to pack it"
    if code is None:
        step.actions.append(Launch(queue_id=head.queue_id, reason=reason))
        return obs.now_s, None, None
    if code != state.launch_held and code != "measuring":
        step.actions.append(Note(sim_id=None, kind="launch-held", reason=reason, code=code,
                                 queue_id=head.queue_id))  # fmt: skip
    no_room: tuple[int, float] | None = None
    if code in ("no-room", "quota"):
        held = state.head_no_room
        no_room = held if held is not None and held[0] == head.queue_id else (
            head.queue_id, obs.now_s)  # fmt: skip
        backfilled = _backfill(step, memory, state, no_room, reason)
        if backfilled is not None:
            step.actions.append(backfilled)
            return obs.now_s, code, no_room
    return state.last_launch_s, code, no_room


def _no_room(obs: Observations, reason: str) -> tuple[str, str]:
    """``no-room``, or ``quota`` when the namespace's quota is what leaves no room."""
    if obs.capacity_bound:
        return "quota", f"{reason}: held within {obs.capacity_bound}"
    return "no-room", reason


def _backfill(
    step: _Step,
    memory: dict[str, SimMemory],
    state: ControllerState,
    head_no_room: tuple[int, float],
    head_reason: str,
) -> Launch | None:
    """A launch of the first simulation behind a head that does not fit, if one would be
    launched as it stands (no pack), while the head has waited less than
    ``backfill_wait_s``."""
    obs, s = step.obs, step.settings
    waited = obs.now_s - head_no_room[1]
    if waited >= s.backfill_wait_s:
        return None
    for queued in obs.queue[1 : 1 + s.backfill_scan]:
        code, reason = _hold_reason(step, memory, state, queued)
        if code is None:
            return Launch(
                queue_id=queued.queue_id,
                reason=f"backfill: {reason}; ahead of it {head_reason} (it has waited"
                f" {waited:.0f} s of the {s.backfill_wait_s:.0f} s backfill allows)",
            )
    return None


def _hold_reason(
    step: _Step, memory: dict[str, SimMemory], state: ControllerState, head: QueuedSim
) -> tuple[str | None, str]:
    """(None, why launch) or (code, why held)."""
    obs, s = step.obs, step.settings
    name = f"queued simulation {head.queue_id}"
    if state.last_launch_s is not None and obs.now_s - state.last_launch_s < s.launch_cooldown_s:
        wait = s.launch_cooldown_s - (obs.now_s - state.last_launch_s)
        return "cooldown", f"{name} waits {wait:.1f} s more after the last launch"
    if not obs.sims:
        floors = s.floor_millis * head.n_ranks
        if s.launch_must_fit and step.unrequested() < floors:
            return _no_room(obs, (
                f"{name} needs at least {floors}m ({head.n_ranks} x the {s.floor_millis}m "
                f"floor), only {max(0, step.unrequested())}m of {obs.capacity_millis}m is "
                "unrequested"
            ))  # fmt: skip
        return None, f"nothing is running: launching {name}"
    # A simulation still starting has no measurements yet, unless it was sized from what
    # an earlier run of its case taught (`learned_duty`): then its duty cycles are known
    # and the head need not wait for its ranks to start (a later launch is a longer stretch
    # of it alone, at one simulation's speed, see docs/controller.md).
    measuring = [
        sim.sim_id
        for sim in obs.sims
        if memory[sim.sim_id].stage in ("warmup", "profiling")
        or (sim.starting and memory[sim.sim_id].stage != "sized")
    ]
    # A simulation sized in this very step: the head's queued view (learned from a running
    # copy) predates it, so decide on the next step.
    measuring += sorted(
        {a.sim_id for a in step.actions if isinstance(a, Resize) and a.kind == "size"}
        - set(measuring)
    )
    if measuring:
        return "measuring", f"{name} waits for {', '.join(measuring)} to be profiled and sized"
    if len(obs.sims) >= s.max_concurrent:
        return (
            "max-concurrent",
            f"{name} waits: {len(obs.sims)} simulations run (max {s.max_concurrent})",
        )
    need = sum(head.initial_request_millis)
    free = step.unrequested()
    no_room = f"{name} needs {need}m, only {free}m of {obs.capacity_millis}m is unrequested"
    # The limit gate packs when it predicts a gain; `off` always packs (it measures what
    # co-location does, which `limit` learns from); the other models only launch what fits.
    if free < need and (s.gate not in ("limit", "off") or any(sim.phases for sim in obs.sims)):
        return _no_room(obs, no_room)
    starting = [sim.sim_id for sim in obs.sims if sim.starting]
    if free < need and starting:
        # A pack shrinks the running simulations' requests in place, which needs their
        # ranks running (a resize of a rank not started yet is not carried out).
        return "measuring", f"{name} waits for {', '.join(starting)} to start before a pack"
    gain = _predicted_gain(step, memory, head)
    if free < need:
        # Requests are shares of the node, not reservations of cores: when the model says
        # the node does more work with one more simulation, everyone's requests shrink in
        # proportion so that all of them fit (`_pack`).
        if gain is None or gain < 1 + s.min_predicted_gain:
            shown = "n/a" if gain is None else f"{gain:.3f}"
            return _no_room(obs, (
                f"{no_room}, and {_model_name(s)} predicts throughput x{shown} with "
                f"{len(obs.sims) + 1} simulations (needs x{1 + s.min_predicted_gain:.3f} to "
                "pack it)"
            ))  # fmt: skip
        if s.gate == "off":
            return (
                "pack",
                f"{no_room}: no gate (--gate off), so all requests shrink in proportion to fit",
            )
        return "pack", (
            f"{no_room}: {_model_name(s)} predicts throughput x{gain:.3f} with "
            f"{len(obs.sims) + 1} simulations, so all requests shrink in proportion to fit"
        )
    if gain is None or gain < 1 + s.min_predicted_gain:
        shown = "n/a" if gain is None else f"{gain:.3f}"
        return "no-gain", (
            f"{name} fits ({need}m of {free}m free) but {_model_name(s)} predicts throughput"
            f" x{shown}"
            f" with {len(obs.sims) + 1} simulations (needs x{1 + s.min_predicted_gain:.3f})"
        )
    if s.gate == "off":
        return None, f"{need}m of {free}m unrequested fits {name}; no gate (--gate off)"
    return None, (
        f"{need}m of {free}m unrequested fits {name}; {_model_name(s)} predicts throughput"
        f" x{gain:.3f} with {len(obs.sims) + 1} simulations"
    )


def _pack(step: _Step, head: QueuedSim, why: str) -> tuple[int, ...] | None:
    """Shrink every running simulation's requests and the head's by one factor so that all
    fit the capacity (floors kept); emit the running ones' Resizes (kind ``pack``,
    decreases) and return the head's requests, or None if the floors do not fit."""
    obs, s = step.obs, step.settings
    total = sum(step.total(sim.sim_id) for sim in obs.sims) + sum(head.initial_request_millis)
    factor = obs.capacity_millis / total
    targets = {
        sim.sim_id: [max(s.floor_millis, math.floor(r * factor)) for r in step.requests[sim.sim_id]]
        for sim in obs.sims
    }
    mine = tuple(max(s.floor_millis, math.floor(r * factor)) for r in head.initial_request_millis)
    if sum(sum(t) for t in targets.values()) + sum(mine) > obs.capacity_millis:
        return None
    reason = (
        f"pack: requests x{factor:.2f} to fit queued simulation {head.queue_id} beside it "
        "(requests are shares; ranks still use idle CPU)"
    )
    for sim in obs.sims:
        new = targets[sim.sim_id]
        step.resize(sim, new, "pack", [reason] * len(new))
    return mine


def _model_name(s: ControllerSettings) -> str:
    if s.gate == "beta" and s.fitted_beta is not None:
        return f"the linear contention model (beta {s.fitted_beta:.3f})"
    if s.gate == "duty":
        return "the duty-cycle model"
    return f"the physical limit x efficiency {s.colocation_efficiency:.2f}"


def _running_duties(sim: SimSnapshot, mem: SimMemory) -> list[float]:
    if mem.stage == "sized" and len(mem.duty) == len(sim.ranks):
        return list(mem.duty)
    out = []
    for r in sim.ranks:
        c, m = r.compute_ns, r.mpi_ns
        out.append(c / (c + m) if c is not None and m is not None and c + m > 0 else 1.0)
    return out


def _predicted_gain(step: _Step, memory: dict[str, SimMemory], head: QueuedSim) -> float | None:
    """throughput(N+1) / throughput(N) from the settings' gate model, or None if not
    computable."""
    s = step.settings
    if s.gate == "off":
        return math.inf
    if s.gate == "beta" and s.fitted_beta is not None:
        shape = _shape(step, memory, head)
        if shape is None:
            return None
        n = len(step.obs.sims)
        return throughput(n + 1, s.fitted_beta, shape) / throughput(n, s.fitted_beta, shape)
    if s.gate == "duty":
        return _duty_model_gain(step, memory, head)
    return _limit_gain(step, memory, head)


def _shape(step: _Step, memory: dict[str, SimMemory], head: QueuedSim) -> ClusterShape | None:
    per_sim = [_running_duties(sim, memory[sim.sim_id]) for sim in step.obs.sims]
    ranks = max([head.n_ranks, *(len(d) for d in per_sim)])
    if ranks < 1 or step.obs.capacity_millis <= 0:
        return None
    return ClusterShape(ranks=ranks, nodes=1, cpus_per_node=step.obs.capacity_millis / 1000)


def _duty_model_gain(step: _Step, memory: dict[str, SimMemory], head: QueuedSim) -> float | None:
    """The duty-cycle overlap predictor (`predict_from_duty_cycles`)."""
    obs = step.obs
    per_sim = [_running_duties(sim, memory[sim.sim_id]) for sim in obs.sims]
    all_duties = [d for ds in per_sim for d in ds]
    shape = _shape(step, memory, head)
    if shape is None or not all_duties:
        return None
    mean = sum(all_duties) / len(all_duties)
    duties = []
    for i in range(shape.ranks):
        column = [ds[i] for ds in per_sim if i < len(ds)]
        duties.append(sum(column) / len(column) if column else mean)
    duties = [min(1.0, max(0.0, d)) for d in duties]
    n = len(obs.sims)
    now = predict_from_duty_cycles(n, duties, shape)
    then = predict_from_duty_cycles(n + 1, duties, shape)
    return then.throughput / now.throughput


def _limit_gain(step: _Step, memory: dict[str, SimMemory], head: QueuedSim) -> float | None:
    """The work-conserving bound (`rankpack.model.limit`) with the co-location efficiency.

    Simulation j computes on ``C_j = sum_i d_i`` cores when alone (rank i's duty cycle d_i,
    a core per rank). A simulation with more ranks than the P cores counts as filling them,
    ``C_j = P``: alone, its ranks' waits are mostly waits for a core its own other ranks
    hold, not free capacity (docs/benchmarks.md: 4-rank pitzDaily pairs on 2 cores gained
    0.71-0.96x with polite waiting). A set S of
    simulations then runs at ``X(S) = |S| x min(1, P / sum_j C_j)`` simulations' worth of
    single-run speed (fair sharing of the cores once their compute exceeds them; waiting
    costs nothing). Spinning waits cost a core: under a fixed ``spin`` mode ``C_j`` is the
    cores its ranks occupy, ``min(R_j, P)``. The head's duty cycles are its
    learned ones, else the running simulations' mean per rank. Prediction:
    ``eta(S+h) X(S+h) / (eta(S) X(S))`` with eta = ``colocation_efficiency`` for two or
    more simulations together and 1 for one alone.
    """
    obs, s = step.obs, step.settings
    cores = obs.capacity_millis / 1000
    if cores <= 0 or not obs.sims:
        return None
    spin = any(sim.wait == "spin" for sim in obs.sims)

    def compute(duties: Sequence[float], ranks: int) -> float:
        if spin or ranks > cores:
            return min(float(ranks), cores)
        return sum(min(1.0, max(0.0, d)) for d in duties)

    duties = [_running_duties(sim, memory[sim.sim_id]) for sim in obs.sims]
    running = [compute(d, len(sim.ranks)) for d, sim in zip(duties, obs.sims, strict=True)]
    if len(head.duty) == head.n_ranks:
        mine = compute(head.duty, head.n_ranks)
    else:
        flat = [d for ds in duties for d in ds]
        mine = compute([sum(flat) / max(1, len(flat))] * head.n_ranks, head.n_ranks)

    def speed(loads: Sequence[float]) -> float:
        total = sum(loads)
        eta = 1.0 if len(loads) < 2 else s.colocation_efficiency
        return eta * len(loads) * (1.0 if total <= cores else cores / total)

    return speed([*running, mine]) / speed(running)


# --- (E) wait modes ----------------------------------------------------------------------


def _wait_modes(step: _Step, memory: dict[str, SimMemory], launching: int) -> None:
    """Switch ``auto`` simulations between spin and polite by where their ranks sit
    (`rankpack.controller.waits`): polite where ranks outnumber a node's cores.
    ``launching``: ranks of a simulation this step launches (not placed yet)."""
    obs = step.obs
    # the loads of every node, once per step (not once per simulation)
    loads, nodes = waits.node_loads(obs, launching), waits.nodes_of(obs)
    crowd = waits.others_crowd(obs, sum(step.total(sim.sim_id) for sim in obs.sims))
    for sim in obs.sims:
        if sim.wait != "auto" or sim.starting or not sim.ranks or not _has_shim(sim):
            continue
        mem = memory[sim.sim_id]
        current = sim.wait_mode or mem.wait_mode or AUTO_LAUNCH_MODE
        choice = waits.choose(sim.wait, [r.node for r in sim.ranks], loads, nodes, crowd)
        if choice.mode == current:
            continue
        step.actions.append(
            SetWaitMode(
                sim_id=sim.sim_id,
                mode=choice.mode,
                reason=f"{choice.reason}: {current} -> {choice.mode}",
                ranks=choice.ranks,
            )
        )
        memory[sim.sim_id] = replace(mem, wait_mode=choice.mode)
