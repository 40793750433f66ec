"""The launch gate: when the head of the queue starts, or what may pass it (pure).

Part of the decision step (`rankpack.controller.policy.decide` calls `launch` after
sizing and fairness); the requests it sees are those the step's earlier actions left.

At most one `Launch` per step, for ``obs.queue[0]``
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
  ``max-concurrent``, ``no-room``, ``quota``, ``no-gain``); waiting for a simulation in warmup or
  profiling (code ``measuring``) is silent. ``quota`` is ``no-room`` when the namespace's
  ResourceQuota is what leaves no room, and the back-off after a launch the quota refused
  (``QueuedSim.retry_at_s``): nothing is launched before it.

`fit_launch` is the same gate's rule for a simulation staged and about to launch on
Kubernetes (`ControllerSettings.launch_must_fit`): its initial requests scale down to the
unrequested capacity, so that every rank pod can be scheduled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rankpack.controller import room
from rankpack.controller.observations import (
    ControllerSettings,
    ControllerState,
    Launch,
    Note,
    Observations,
    QueuedSim,
    Resize,
    SimMemory,
    SimSnapshot,
)
from rankpack.controller.room import Room
from rankpack.controller.step import Step
from rankpack.model.contention import throughput
from rankpack.model.overlap import predict_from_duty_cycles
from rankpack.model.shape import ClusterShape
from rankpack.plan.allocation import proportional_millis


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
            step.actions.append(Launch(queue_id=head.queue_id, reason=reason,
                                       request_millis=packed, nodes=nodes))  # fmt: skip
            pipe.took(head, packed, nodes)
            return pipe.gated(obs.now_s, None, None)
        else:
            code, reason = _no_room(obs, f"{reason}; but the floors leave no room to pack it")
    if code is None:
        nodes = pipe.place(head.initial_request_millis, open_only=False)
        step.actions.append(Launch(queue_id=head.queue_id, reason=reason, nodes=nodes))
        pipe.took(head, head.initial_request_millis, nodes)
        pipe.behind(obs.queue[1:])
        return pipe.gated(obs.now_s, None, None)
    if code in PIPELINED and pipe.launch(head, code, reason):
        pipe.behind(obs.queue[1:])
        return pipe.gated(obs.now_s, None, None)
    if code != state.launch_held and code != "measuring":
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
                step.actions.append(Launch(queue_id=queued.queue_id, nodes=nodes,
                                           reason=f"backfill: {reason}{why}"))  # fmt: skip
                pipe.took(queued, queued.initial_request_millis, nodes)
                launched = True
                continue
            if code not in PIPELINED:
                continue
        piped = pipe.reason(queued)
        if piped is not None:
            nodes = pipe.place(queued.initial_request_millis, open_only=True)
            step.actions.append(Launch(queue_id=queued.queue_id, nodes=nodes,
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
            Launch(queue_id=head.queue_id, reason=f"{reason} (the gate alone: {held})", nodes=nodes)
        )
        self.took(head, head.initial_request_millis, nodes)
        return True

    def behind(self, queue: Sequence[QueuedSim]) -> None:
        """After the head: those behind it, in order, while each is launched."""
        for queued in queue:
            if self.stopped() or self.reason(queued) is None:
                return
            nodes = self.place(queued.initial_request_millis, open_only=True)
            self.step.actions.append(Launch(queue_id=queued.queue_id, reason=self.reason_text,
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
            f"{_model_name(s)} predicts throughput x{shown} with {n + 1} simulations "
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
        loads = _loads(self.step, self.memory)
        running = [*loads.running, *(loads.of(q) for q in self.launched)]
        return _speed([*running, loads.of(queued)], loads.cores, s) / _speed(
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


def _compute(duties: Sequence[float], ranks: int, cores: float, spin: bool) -> float:
    """The cores a simulation computes on alone (`_limit_gain`)."""
    if spin or ranks > cores:
        return min(float(ranks), cores)
    return sum(min(1.0, max(0.0, d)) for d in duties)


def _speed(loads: Sequence[float], cores: float, s: ControllerSettings) -> float:
    """X(S): simulations' worth of single-run speed of the set with these loads."""
    if not loads:
        return 0.0
    total = sum(loads)
    eta = 1.0 if len(loads) < 2 else s.colocation_efficiency
    return eta * len(loads) * (1.0 if total <= cores else cores / total)


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


def _model_name(s: ControllerSettings) -> str:
    if s.gate == "beta" and s.fitted_beta is not None:
        return f"the linear contention model (beta {s.fitted_beta:.3f})"
    if s.gate == "duty":
        return "the duty-cycle model"
    return f"the physical limit x efficiency {s.colocation_efficiency:.2f}"


def _running_duties(sim: SimSnapshot, mem: SimMemory) -> list[float]:
    if mem.stage == "sized" and len(mem.duty) == len(sim.ranks):
        return list(mem.duty)
    return list(sim.counter_duties)


def _predicted_gain(step: Step, memory: dict[str, SimMemory], head: QueuedSim) -> float | None:
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


def _shape(step: Step, memory: dict[str, SimMemory], head: QueuedSim) -> ClusterShape | None:
    per_sim = [_running_duties(sim, memory[sim.sim_id]) for sim in step.obs.sims]
    ranks = max([head.n_ranks, *(len(d) for d in per_sim)])
    if ranks < 1 or step.obs.capacity_millis <= 0:
        return None
    return ClusterShape(ranks=ranks, nodes=1, cpus_per_node=step.obs.capacity_millis / 1000)


def _duty_model_gain(step: Step, memory: dict[str, SimMemory], head: QueuedSim) -> float | None:
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


def _limit_gain(step: Step, memory: dict[str, SimMemory], head: QueuedSim) -> float | None:
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
    if obs.capacity_millis <= 0 or not obs.sims:
        return None
    loads = _loads(step, memory)
    mine = loads.of(head)
    return _speed([*loads.running, mine], loads.cores, s) / _speed(loads.running, loads.cores, s)


@dataclass(frozen=True)
class _Loads:
    """What the limit gate counts of the simulations running, once per step."""

    running: list[float]
    """Per simulation, the cores it computes on alone (`_compute`)."""
    mean_duty: float
    """The running ranks' mean duty cycle (the head's, when it has none of its own)."""
    cores: float
    spin: bool

    def of(self, queued: QueuedSim) -> float:
        """The head's load: its learned duty cycles, else the running ones' mean."""
        duty = queued.duty if len(queued.duty) == queued.n_ranks else (
            [self.mean_duty] * queued.n_ranks)  # fmt: skip
        return _compute(duty, queued.n_ranks, self.cores, self.spin)


def _loads(step: Step, memory: dict[str, SimMemory]) -> _Loads:
    """Once per step; each simulation's duty sums are kept by the memory (sized) or the
    snapshot (measured) they come from, so a step costs a sum per simulation, not per
    rank: the same values as summing its duties here."""
    cached = step.memo.get("limit-loads")
    if isinstance(cached, _Loads):
        return cached
    obs = step.obs
    cores = obs.capacity_millis / 1000
    spin = any(sim.wait == "spin" for sim in obs.sims)
    sums = [_duty_sums(sim, memory[sim.sim_id]) for sim in obs.sims]
    running = [
        min(float(len(sim.ranks)), cores) if spin or len(sim.ranks) > cores else clamped
        for (_, clamped, _), sim in zip(sums, obs.sims, strict=True)
    ]  # `_compute` of its duties
    flat = sum(total for total, _, _ in sums), sum(n for _, _, n in sums)
    loads = _Loads(running, flat[0] / max(1, flat[1]), cores, spin)
    step.memo["limit-loads"] = loads
    return loads


def _duty_sums(sim: SimSnapshot, mem: SimMemory) -> tuple[float, float, int]:
    """(sum, sum clamped to [0, 1], count) of `_running_duties`."""
    if mem.stage == "sized" and len(mem.duty) == len(sim.ranks):
        return mem.duty_sums
    return sim.counter_duty_sums


def fit_launch(wanted: Sequence[int], free_millis: int, floor_millis: int) -> list[int] | None:
    """The initial requests of a simulation about to launch scaled down to ``free_millis``
    (floors kept, in proportion), or None when they fit as they are or even the floors do
    not (then it launches as planned and waits to be scheduled)."""
    if sum(wanted) <= free_millis or free_millis < floor_millis * len(wanted):
        return None
    return proportional_millis([float(w) for w in wanted], free_millis, floor_millis)
