"""The launch gate: when the head of the queue is staged, or what may pass it (pure).

Part of the decision step (`rankpack.controller.policy.decide` calls `launch` after
sizing and fairness); the requests it sees are those the step's earlier actions left. It
emits `StageJob` (claim and stage; the launch follows once staged, `rankpack.controller.staged`).

At most one `StageJob` per step for ``obs.queue[0]`` (FIFO), or - while the head does not fit
(``no-room``) and has waited less than ``backfill_wait_s`` since it stopped fitting - the
first of the next ``backfill_scan`` simulations that would be launched by the same rules
(backfill; after that wait nothing passes the head, so neither wide nor narrow simulations
starve); on several nodes the pipeline launches more (`rankpack.controller.room`). With
nothing running it launches at once, only held by the launch cooldown (a guard against a
launch the observations do not show yet). Otherwise every running simulation must be
``sized`` or ``scheduled`` and have started its ranks (one still starting counts when it
was sized from learned duty cycles, unless the launch needs a pack), fewer than
``max_concurrent`` running, the cooldown over, the unrequested capacity >= the head's
initial requests (or the running ones packed to fit), and the throughput model must
predict a gain of ``min_predicted_gain`` (`rankpack.controller.gains`). When the head is
held back a ``launch-held`` note is emitted only when the reason code changes
(``cooldown``, ``measuring``: a simulation still in warm-up or profiling, ``max-concurrent``,
``no-room``, ``quota``, ``no-gain``), so that what a Simulation's status says of why it
waits is never a reason that no longer holds. ``quota`` is ``no-room``
when the namespace's ResourceQuota is what leaves no room, and the back-off after a launch
the quota refused (``QueuedSim.retry_at_s``): nothing is launched before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rankpack.controller import gains, room
from rankpack.controller.decision import (
    ControllerSettings,
    ControllerState,
    Observations,
    QueuedSim,
    SimMemory,
)
from rankpack.controller.room import Room
from rankpack.controller.step import Step
from rankpack.core.actions import Note, Resize, StageJob


@dataclass(frozen=True)
class Gated:
    """What the gate leaves for the next step."""

    last_launch_s: float | None
    launch_held: str | None
    head_no_room: tuple[int, float] | None
    launch_bucket: tuple[float, float] | None


def launch(step: Step, memory: dict[str, SimMemory], state: ControllerState) -> Gated:
    """Launch the head of the queue and, through the pipeline, those behind it while the
    room, the rate and the launches in flight allow; or backfill behind a head that does
    not fit; or say why not."""
    obs, s = step.obs, step.settings
    bucket = _refill(state.launch_bucket, obs.now_s, s)
    if not obs.queue:
        return Gated(state.last_launch_s, None, None, _bucket_state(bucket, obs.now_s, s))
    pipe = _Pipeline(step, memory, state, bucket)
    head = obs.queue[0]
    code, reason = _hold_reason(step, memory, state, head)
    if code is None or code == "pack":
        code, reason = pipe.rated(code, reason)
    if code == "pack":
        packed = _pack(step, head, reason)
        if packed == "paced":
            s = step.settings
            code, reason = (
                "cooldown",
                (
                    f"{reason}; but its resizes wait for the resize rate (resize_rate_per_s "
                    f"{s.resize_rate_per_s:g}, per node {s.resize_rate_per_node_s:g})"
                ),
            )
        elif packed is not None:
            nodes = pipe.place(packed, open_only=False)
            step.actions.append(StageJob(queue_id=head.queue_id, reason=reason,
                                       request_millis=packed, nodes=nodes))  # fmt: skip
            pipe.took(head, packed, nodes)
            return pipe.gated(obs.now_s, None, None)
        else:
            code, reason = _no_room(obs, f"{reason}; but the floors leave no room to pack it")
    if code is None:
        nodes = pipe.place(head.initial_request_millis, open_only=False)
        step.actions.append(StageJob(queue_id=head.queue_id, reason=reason, nodes=nodes))
        pipe.took(head, head.initial_request_millis, nodes)
        pipe.behind(obs.queue[1:])
        return pipe.gated(obs.now_s, None, None)
    if code in PIPELINED and pipe.launch(head, code, reason):
        pipe.behind(obs.queue[1:])
        return pipe.gated(obs.now_s, None, None)
    if code != state.launch_held:
        step.actions.append(Note(sim_id=None, kind="launch-held", reason=reason, code=code,
                                 queue_id=head.queue_id))  # fmt: skip
    no_room: tuple[int, float] | None = None
    if code in ("no-room", "quota") or (code in PIPELINED and pipe.several_nodes):
        held = state.head_no_room
        no_room = held if held is not None and held[0] == head.queue_id else (
            head.queue_id, obs.now_s)  # fmt: skip
        if _backfill(step, memory, state, pipe, no_room, reason):
            return pipe.gated(obs.now_s, code, no_room)
    return pipe.gated(state.last_launch_s, code, no_room)


PIPELINED = ("cooldown", "measuring", "no-gain")
"""Holds the pipeline may lift: the head fits room that no simulation being measured
shares, on nodes that took no launch for a cooldown, and one more simulation is worth
``min_predicted_gain`` of one (`_Pipeline.reason`)."""


def _no_room(obs: Observations, reason: str) -> tuple[str, str]:
    """``no-room``, or ``quota`` when the namespace's quota is what leaves no room."""
    if obs.capacity_bound:
        return "quota", f"{reason}: held within {obs.capacity_bound}"
    return "no-room", reason


def _backfill(
    step: Step,
    memory: dict[str, SimMemory],
    state: ControllerState,
    pipe: _Pipeline,
    head_no_room: tuple[int, float],
    head_reason: str,
) -> bool:
    """Launch the first simulations behind a head that does not fit that would be launched
    as they stand (no pack), while the head has waited less than ``backfill_wait_s``
    (the pipeline goes on behind the first while the room and the rate allow); whether
    one was launched."""
    obs, s = step.obs, step.settings
    waited = obs.now_s - head_no_room[1]
    if waited >= s.backfill_wait_s:
        return False
    launched = False
    for queued in obs.queue[1 : 1 + s.backfill_scan]:
        if pipe.stopped():
            break
        why = (
            f"; ahead of it {head_reason} (it has waited {waited:.0f} s of the "
            f"{s.backfill_wait_s:.0f} s backfill allows)"
        )
        if not launched:
            code, reason = _hold_reason(step, memory, state, queued)
            if code is None:
                code, reason = pipe.rated(code, reason)
            if code is None:
                nodes = pipe.place(queued.initial_request_millis, open_only=False)
                step.actions.append(StageJob(queue_id=queued.queue_id, nodes=nodes,
                                           reason=f"backfill: {reason}{why}"))  # fmt: skip
                pipe.took(queued, queued.initial_request_millis, nodes)
                launched = True
                continue
            if code not in PIPELINED:
                continue
        piped = pipe.reason(queued)
        if piped is not None:
            nodes = pipe.place(queued.initial_request_millis, open_only=True)
            step.actions.append(StageJob(queue_id=queued.queue_id, nodes=nodes,
                                       reason=f"backfill: {piped}{why}"))  # fmt: skip
            pipe.took(queued, queued.initial_request_millis, nodes)
            launched = True
    return launched


class _Pipeline:
    """The launches of one step beyond the gate's first (see `rankpack.controller.room`):
    the overall rate (a bucket), the launches in flight, the open room node by node, and the
    throughput model with this step's launches counted as running."""

    def __init__(
        self, step: Step, memory: dict[str, SimMemory], state: ControllerState, bucket: float
    ) -> None:
        self.step, self.memory, self.state, self.bucket = step, memory, state, bucket
        obs = step.obs
        self.several_nodes = len(obs.nodes) > 1
        self.launched: list[QueuedSim] = []
        self.starting = sum(1 for sim in obs.sims if sim.starting)
        self._room: Room | None = None

    @property
    def room(self) -> Room:
        if self._room is None:
            self._room = room.build(self.step, self.memory, self.step.settings.launch_cooldown_s)
        return self._room

    def rated(self, code: str | None, reason: str) -> tuple[str | None, str]:
        """The gate's launch (or pack), unless the rate or the launches in flight hold it."""
        s = self.step.settings
        if self.bucket < 1:
            wait = (1 - self.bucket) / s.launch_rate_per_s if s.launch_rate_per_s > 0 else 0
            return "cooldown", (
                f"the launch rate ({s.launch_rate_per_s:g}/s) waits {wait:.1f} s more after "
                "the last launches"
            )
        if self.starting + len(self.launched) >= s.max_starting:
            return "cooldown", (
                f"{self.starting + len(self.launched)} launches in flight (max_starting "
                f"{s.max_starting}): waits for one to start"
            )
        return code, reason

    def stopped(self) -> bool:
        s = self.step.settings
        return (
            self.bucket < 1
            or self.starting + len(self.launched) >= s.max_starting
            or len(self.step.obs.sims) + len(self.launched) >= s.max_concurrent
        )

    def place(self, requests: Sequence[int], open_only: bool) -> tuple[str, ...]:
        """Each rank's node for a launch of ``requests`` on a cluster of several nodes
        (`room.place`: the open nodes only for a pipelined launch); () on one node, or when
        no placement fits (the scheduler places the ranks)."""
        if not self.several_nodes:
            return ()
        return self.room.place(requests, open_only) or ()

    def took(self, queued: QueuedSim, requests: Sequence[int], nodes: Sequence[str] = ()) -> None:
        self.launched.append(queued)
        self.bucket -= 1
        if self.several_nodes and nodes:
            self.room.take_on(requests, nodes)
        elif self.several_nodes:
            self.room.take(requests)

    def launch(self, head: QueuedSim, code: str, held: str) -> bool:
        """Lift the gate's hold of the head when the pipeline allows it."""
        reason = self.reason(head)
        if reason is None:
            return False
        nodes = self.place(head.initial_request_millis, open_only=True)
        self.step.actions.append(
            StageJob(
                queue_id=head.queue_id, reason=f"{reason} (the gate alone: {held})", nodes=nodes
            )
        )
        self.took(head, head.initial_request_millis, nodes)
        return True

    def behind(self, queue: Sequence[QueuedSim]) -> None:
        """After the head: those behind it, in order, while each is launched."""
        for queued in queue:
            if self.stopped() or self.reason(queued) is None:
                return
            nodes = self.place(queued.initial_request_millis, open_only=True)
            self.step.actions.append(StageJob(queue_id=queued.queue_id, reason=self.reason_text,
                                            nodes=nodes))  # fmt: skip
            self.took(queued, queued.initial_request_millis, nodes)

    reason_text = ""

    def reason(self, queued: QueuedSim) -> str | None:
        """Why ``queued`` is launched by the pipeline now, or None if it is not."""
        step, s = self.step, self.step.settings
        obs = step.obs
        if not self.several_nodes or self.stopped() or s.gate not in ("limit", "off"):
            return None
        if queued.retry_at_s is not None and obs.now_s < queued.retry_at_s:
            return None
        if not obs.sims and not self.launched:
            return None  # the gate's own rules launch the first one
        need = sum(queued.initial_request_millis)
        room_ = self.room
        if not room_.fits(queued.initial_request_millis):
            return None
        gain = self._gain(queued)
        n = len(obs.sims) + len(self.launched)
        wanted = 1 + s.min_predicted_gain / max(1, n)
        if gain < wanted:
            return None
        name = f"queued simulation {queued.queue_id}"
        shown = "inf" if math.isinf(gain) else f"{gain:.3f}"
        self.reason_text = (
            f"pipeline: {need}m of the {room_.open_millis}m open to a launch fits {name} "
            f"(no simulation measured there, no launch there for {s.launch_cooldown_s:g} s); "
            f"{gains.model_name(s)} predicts throughput x{shown} with {n + 1} simulations "
            f"(needs x{wanted:.3f}: {s.min_predicted_gain:g} of one simulation)"
        )
        return self.reason_text

    def _gain(self, queued: QueuedSim) -> float:
        """The limit model (`_limit_gain`) over what runs and what this step launched."""
        s, obs = self.step.settings, self.step.obs
        if s.gate == "off":
            return math.inf
        if obs.capacity_millis <= 0:
            return 0.0
        loads = gains.limit_loads(self.step, self.memory)
        running = [*loads.running, *(loads.of(q) for q in self.launched)]
        return gains.speed([*running, loads.of(queued)], loads.cores, s) / gains.speed(
            running, loads.cores, s
        )

    def gated(
        self, last_launch_s: float | None, held: str | None, no_room: tuple[int, float] | None
    ) -> Gated:
        obs, s = self.step.obs, self.step.settings
        return Gated(last_launch_s, held, no_room, _bucket_state(self.bucket, obs.now_s, s))


def _refill(bucket: tuple[float, float] | None, now_s: float, s: ControllerSettings) -> float:
    """Launches the rate allows at ``now_s`` (at most ``launch_burst``)."""
    if bucket is None:
        return float(s.launch_burst)
    tokens, at_s = bucket
    return min(float(s.launch_burst), tokens + max(0.0, now_s - at_s) * s.launch_rate_per_s)


def _bucket_state(tokens: float, now_s: float, s: ControllerSettings) -> tuple[float, float] | None:
    return None if tokens >= s.launch_burst else (tokens, now_s)


def _hold_reason(
    step: Step, memory: dict[str, SimMemory], state: ControllerState, head: QueuedSim
) -> tuple[str | None, str]:
    """(None, why launch) or (code, why held)."""
    obs, s = step.obs, step.settings
    name = f"queued simulation {head.queue_id}"
    if head.retry_at_s is not None and obs.now_s < head.retry_at_s:
        # its last launch was refused for quota (taken between plan and create): back-off
        return "quota", (
            f"{name} was refused at launch ({head.retry_reason}); tried again in "
            f"{head.retry_at_s - obs.now_s:.0f} s"
        )
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
    return _by_room(step, memory, head, name)


def _by_room(
    step: Step, memory: dict[str, SimMemory], head: QueuedSim, name: str
) -> tuple[str | None, str]:
    """`_hold_reason` once nothing is measured and fewer than ``max_concurrent`` run: the
    head fits, or the running simulations may be packed for it, when the model predicts
    a gain."""
    obs, s = step.obs, step.settings
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
    stale = [sim.sim_id for sim in obs.sims if not sim.readings_ok]
    if free < need and stale:
        # a pack resizes every running simulation; nothing is resized on stale readings
        return "measuring", f"{name} waits for {', '.join(stale)} to be read again before a pack"
    gain = gains.predicted_gain(step, memory, head)
    if free < need:
        # Requests are shares of the node, not reservations of cores: when the model says
        # the node does more work with one more simulation, everyone's requests shrink in
        # proportion so that all of them fit (`_pack`).
        if gain is None or gain < 1 + s.min_predicted_gain:
            shown = "n/a" if gain is None else f"{gain:.3f}"
            return _no_room(obs, (
                f"{no_room}, and {gains.model_name(s)} predicts throughput x{shown} with "
                f"{len(obs.sims) + 1} simulations (needs x{1 + s.min_predicted_gain:.3f} to "
                "pack it)"
            ))  # fmt: skip
        if s.gate == "off":
            return (
                "pack",
                f"{no_room}: no gate (--gate off), so all requests shrink in proportion to fit",
            )
        return "pack", (
            f"{no_room}: {gains.model_name(s)} predicts throughput x{gain:.3f} with "
            f"{len(obs.sims) + 1} simulations, so all requests shrink in proportion to fit"
        )
    if gain is None or gain < 1 + s.min_predicted_gain:
        shown = "n/a" if gain is None else f"{gain:.3f}"
        return "no-gain", (
            f"{name} fits ({need}m of {free}m free) but {gains.model_name(s)} predicts throughput"
            f" x{shown}"
            f" with {len(obs.sims) + 1} simulations (needs x{1 + s.min_predicted_gain:.3f})"
        )
    if s.gate == "off":
        return None, f"{need}m of {free}m unrequested fits {name}; no gate (--gate off)"
    return None, (
        f"{need}m of {free}m unrequested fits {name}; {gains.model_name(s)} predicts throughput"
        f" x{gain:.3f} with {len(obs.sims) + 1} simulations"
    )


def _pack(step: Step, head: QueuedSim, why: str) -> tuple[int, ...] | Literal["paced"] | None:
    """Shrink every running simulation's requests and the head's by one factor so that all
    fit the capacity (floors kept); emit the running ones' Resizes (kind ``pack``,
    decreases) and return the head's requests, None if the floors do not fit, or
    ``paced`` if the resize rate cannot send them all now (the launch waits for them)."""
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
    changes: dict[str | None, int] = {}
    for sim in obs.sims:
        for rank, want, had in zip(sim.ranks, targets[sim.sim_id], step.requests[sim.sim_id],
                                   strict=True):  # fmt: skip
            if want != had:
                changes[rank.node] = changes.get(rank.node, 0) + 1
    if not step.resize_room(changes):
        return "paced"
    reason = (
        f"pack: requests x{factor:.2f} to fit queued simulation {head.queue_id} beside it "
        "(requests are shares; ranks still use idle CPU)"
    )
    for sim in obs.sims:
        new = targets[sim.sim_id]
        step.resize(sim, new, "pack", [reason] * len(new))
    return mine
