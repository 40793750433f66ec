"""In-place resizes from the policy's action to their outcome: send, hold, follow, retry.

Every rank's resize the loop is busy with is one `RankResize`: the request in flight
(`InFlight`: asked when, from what to what, of which kind and why, deferred or not), the
request last asked for, an increase held back, a failed request due again, the retries so
far. `Resizes` owns them and is the only part of the loop that calls `Backend.resize`.

* Order. A node admits resizes one at a time against what is allocated *now*, so trading
  CPU between ranks (one shrinks, another grows, the total fits) can see the increase
  refused (kubelet: Deferred, "OutOfcpu") while the decrease is still in flight, and a
  deferred resize is only tried again much later (~13 s measured on the dev cluster). So
  every decrease is sent first and an increase is held while a decrease is in flight on
  its node (any node, for a rank whose node is not known); held increases go out as soon
  as none is (`release_held`, every tick). On a cluster, a decrease on one node never
  holds an increase on another.
* Cost. What is held, due again or in flight is indexed, so a tick looks at those only,
  not at every rank the loop ever resized.
* Follow. A resize is settled once the backend reports a final state, or the run ends.
  Deferred (the node cannot grant it now; the kubelet keeps it and tries again) is not
  final: it is recorded once as ``resize-deferred`` and followed on; it counts only if it
  completes.
* Retry. A FAILED resize (not applied: e.g. the apiserver did not answer) is asked for
  again after the policy's back-off (`rankpack.controller.policy.retry_delay_s`) until it
  is given up; refusals are not asked for again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rankpack.backend.protocol import BackendError, RankResources, ResizeState
from rankpack.controller.policy import retry_delay_s
from rankpack.controller.tracked import LoopContext, Tracked
from rankpack.core.actions import Resize, ResizeKind
from rankpack.core.failures import FailureCode
from rankpack.core.results import ResizeRecord


@dataclass
class InFlight:
    """A resize asked of the backend and not settled yet."""

    t_s: float
    """When it was asked, seconds since its simulation's launch."""
    from_millis: int
    to_millis: int
    kind: ResizeKind
    reason: str
    deferred: str | None = None
    """Why the node deferred it (recorded once), None while it is not deferred."""

    @property
    def decrease(self) -> bool:
        return self.to_millis < self.from_millis


@dataclass
class RankResize:
    """What the loop holds of one rank's resizes."""

    inflight: InFlight | None = None
    asked_millis: int | None = None
    """The request last asked for and not refused (newer than the last observation when it
    was asked after it)."""
    held: Resize | None = None
    """An increase waiting for the decreases in flight to settle."""
    held_order: int = 0
    """Held increases go out in the order they were held."""
    held_noted: bool = False
    """A ``resize-held`` event has been recorded for ``held``."""
    retry: Resize | None = None
    """A failed resize asked for again at ``retry_due_s``."""
    retry_due_s: float = 0.0
    attempts: int = 0
    """Retries so far of the resize in flight (0: the first request)."""
    seq: int = 0
    """When the loop first held anything of the rank (the order retries are asked in)."""


class Resizes:
    """Every rank's resize of the loop's simulations (see the module docstring)."""

    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx
        self.ranks: dict[tuple[str, int], RankResize] = {}
        self._held_seq = 0
        self._gone = 0
        self._held: dict[tuple[str, int], RankResize] = {}
        self._retrying: set[tuple[str, int]] = set()
        self._flying: dict[tuple[str, int], str | None] = {}
        """Resizes in flight, and the node of their rank (None: not known)."""
        self._shrinking: dict[tuple[str, int], str | None] = {}
        """The decreases among them."""
        self._flying_per_sim: dict[str, int] = {}
        """How many resizes are in flight per simulation (those with none are not
        followed rank by rank)."""

    def busy(self) -> set[str]:
        """The simulations with a resize in flight, held or due again (observed every
        tick: their resizes are followed)."""
        return {key[0] for keys in (self._held, self._retrying, self._flying) for key in keys}

    def flying_in(self, sim_id: str) -> bool:
        """Some rank of the simulation has a resize in flight."""
        return sim_id in self._flying_per_sim

    def _of(self, sim_id: str, rank: int) -> RankResize:
        entry = self.ranks.get((sim_id, rank))
        if entry is None:
            entry = self.ranks[(sim_id, rank)] = RankResize(seq=len(self.ranks) + self._gone)
        return entry

    def inflight(self, sim_id: str, rank: int) -> InFlight | None:
        entry = self.ranks.get((sim_id, rank))
        return entry.inflight if entry else None

    def asked_millis(self, sim_id: str, rank: int) -> int | None:
        entry = self.ranks.get((sim_id, rank))
        return entry.asked_millis if entry else None

    # -- the policy's actions ------------------------------------------------------------

    def send_decreases(self, actions: Sequence[Resize]) -> list[Resize]:
        """Send the decreases among a decision's resizes now; return the increases (held by
        `hold` after the decision's other actions). A new action supersedes what was held
        or due again for its rank, and starts its retries afresh."""
        grows = []
        for action in actions:
            key = (action.sim_id, action.rank)
            entry = self._of(*key)
            entry.held, entry.held_noted, entry.retry, entry.attempts = None, False, None, 0
            self._held.pop(key, None)
            self._retrying.discard(key)
            if self._change(action) < 0:
                self._send(action)
            else:
                grows.append(action)
        return grows

    def hold(self, grows: Sequence[Resize]) -> None:
        for action in grows:
            self._hold(action)
        self.release_held()

    def _hold(self, action: Resize) -> None:
        key = (action.sim_id, action.rank)
        entry = self._of(*key)
        entry.held, self._held_seq = action, self._held_seq + 1
        entry.held_order = self._held_seq
        self._held[key] = entry

    def release_held(self) -> None:
        """Send the held increases whose node has no decrease in flight (else say why,
        once)."""
        if not self._held:
            return
        held = sorted(self._held.items(), key=lambda item: item[1].held_order)
        on_node: dict[str | None, int] = {}
        for node in self._shrinking.values():
            on_node[node] = on_node.get(node, 0) + 1
        for key, entry in held:
            if entry.held is None:
                self._held.pop(key, None)
                continue
            node = self._node(key)
            shrinking = sum(on_node.values()) if node is None else (
                on_node.get(node, 0) + on_node.get(None, 0))  # fmt: skip
            if shrinking:
                if not entry.held_noted:
                    sim = self.ctx.sims.get(key[0])
                    why = f"{shrinking} decrease(s) in flight settle first"
                    self.ctx.event(sim.run_id if sim else None, "resize-held",
                                   rank=entry.held.rank,
                                   request_millis=entry.held.request_millis,
                                   reason=why)  # fmt: skip
                    entry.held_noted = True
                continue
            action, entry.held, entry.held_noted = entry.held, None, False
            self._held.pop(key, None)
            if action.sim_id in self.ctx.sims:
                self._send(action)

    def _node(self, key: tuple[str, int]) -> str | None:
        """The node of a rank, as last observed (None: not known)."""
        sim = self.ctx.sims.get(key[0])
        if sim is None or sim.last is None or key[1] >= len(sim.last.ranks):
            return None
        return sim.last.ranks[key[1]].node

    def retry_due(self) -> None:
        """Ask again for the failed resizes whose back-off is over (an increase is held
        while decreases are in flight)."""
        now = self.ctx.now()
        for key in sorted(self._retrying, key=lambda k: self.ranks[k].seq):
            entry = self.ranks[key]
            action = entry.retry
            if action is None:
                self._retrying.discard(key)
                continue
            if entry.retry_due_s > now:
                continue
            entry.retry = None
            self._retrying.discard(key)
            if action.sim_id not in self.ctx.sims:
                entry.attempts = 0
                continue
            if self._change(action) < 0:
                self._send(action)
            else:
                self._hold(action)

    def _change(self, action: Resize) -> int:
        """The resize's change of request (millicores); 0 when the simulation is gone."""
        sim = self.ctx.sims.get(action.sim_id)
        if sim is None or sim.last is None or action.rank >= len(sim.last.ranks):
            return 0
        return action.request_millis - sim.last.ranks[action.rank].desired.request_millis

    def _send(self, action: Resize) -> None:
        ctx = self.ctx
        sim = ctx.sims.get(action.sim_id)
        if sim is None or not sim.launched or sim.last is None:
            return
        rank = action.rank
        old = sim.last.ranks[rank].desired
        t_s = ctx.backend.clock() - sim.t0
        new = RankResources(action.request_millis, old.limit_millis)
        code: FailureCode | None = None
        try:
            status = ctx.backend.resize(sim.sim_id, rank, new)
            state, latency, why, code = status.state, status.latency_s, status.reason, status.code
        except BackendError as exc:
            state, latency, why = ResizeState.REJECTED, None, str(exc)
        entry = self._of(sim.sim_id, rank)
        self._fly(sim.sim_id, rank, InFlight(t_s, old.request_millis, action.request_millis,
                                             action.kind, action.reason))  # fmt: skip
        entry.asked_millis = action.request_millis
        self.follow(sim, rank, state, latency, why, code=code)
        if entry.inflight is not None:
            ctx.event(sim.run_id, "resize-requested", rank=rank, kind=action.kind,
                      request_millis=action.request_millis, reason=action.reason)  # fmt: skip

    # -- following -----------------------------------------------------------------------

    def follow(
        self,
        sim: Tracked,
        rank: int,
        state: ResizeState,
        latency_s: float | None,
        why: str,
        *,
        ended: bool = False,
        code: FailureCode | None = None,
    ) -> None:
        """Settle the rank's in-flight resize once ``state`` is final (or the run ``ended``);
        ``code``: why it was refused, when the backend says (``QuotaExceeded``)."""
        ctx = self.ctx
        entry = self.ranks.get((sim.sim_id, rank))
        flight = entry.inflight if entry else None
        if entry is None or flight is None:
            return
        if state is ResizeState.DEFERRED and not ended:
            if flight.deferred is None:
                flight.deferred = why
                ctx.event(sim.run_id, "resize-deferred", rank=rank,
                          request_millis=flight.to_millis,
                          reason=f"{why or 'deferred by the node'}; the node tries it again, "
                          "counted once it completes")  # fmt: skip
            return
        if not state.final and not ended:
            return
        if ended and flight.deferred is not None:
            state = ResizeState.DEFERRED
            why = f"still deferred when the run ended ({flight.deferred})"
        self._fly(sim.sim_id, rank, None)
        outcome = str(state) if state is not ResizeState.COMPLETED else "completed"
        record = ResizeRecord(
            rank=rank, t_s=round(flight.t_s, 3), from_millis=flight.from_millis,
            to_millis=flight.to_millis, status=outcome,  # type: ignore[arg-type]  # a final state's name
            latency_s=latency_s, reason=flight.reason if state is ResizeState.COMPLETED else why,
            kind=flight.kind,
        )  # fmt: skip
        sim.resizes.append(record)
        assert sim.run_id is not None
        ctx.store.add_resize(sim.run_id, record)
        if state is ResizeState.COMPLETED:
            ctx.tally.resizes += 1
            ctx.event(sim.run_id, "resize", kind=flight.kind, rank=rank,
                      request_millis=flight.to_millis, reason=flight.reason,
                      latency_s=latency_s)  # fmt: skip
        else:
            # The rank keeps running with its old request; the policy sees that next tick.
            entry.asked_millis = None
            ctx.tally.rejected += 1
            coded = {"code": str(code)} if code is not None else {}
            ctx.event(sim.run_id, f"resize-{outcome}", rank=rank,
                      request_millis=flight.to_millis, reason=why, final=True,
                      **coded)  # fmt: skip
            if state is ResizeState.FAILED and not ended:
                self._retry(sim, entry, Resize(sim.sim_id, rank, flight.to_millis,
                                               flight.reason, flight.kind), why)  # fmt: skip
        if state is ResizeState.COMPLETED or ended:
            entry.attempts = 0

    def _retry(self, sim: Tracked, entry: RankResize, action: Resize, why: str) -> None:
        attempt = entry.attempts
        delay = retry_delay_s(attempt)
        if delay is None:
            entry.attempts = 0
            self.ctx.event(sim.run_id, "resize-given-up", rank=action.rank,
                           request_millis=action.request_millis,
                           reason=f"failed {attempt + 1} times; last: {why}")  # fmt: skip
            return
        entry.attempts = attempt + 1
        entry.retry, entry.retry_due_s = action, self.ctx.now() + delay
        self._retrying.add((sim.sim_id, action.rank))
        self.ctx.event(sim.run_id, "resize-retry", rank=action.rank,
                       request_millis=action.request_millis, attempt=attempt + 1,
                       delay_s=delay, reason=f"asked again in {delay:g} s: {why}")  # fmt: skip

    def ended(self, sim: Tracked) -> None:
        """The run ended: settle what is in flight (as failed, or still deferred) and
        forget its ranks' resizes."""
        for _, rank in [k for k in self._flying if k[0] == sim.sim_id]:
            self.follow(sim, rank, ResizeState.FAILED, None, "the run ended first",
                        ended=True)  # fmt: skip
        for key in [k for k in self.ranks if k[0] == sim.sim_id]:
            del self.ranks[key]
            self._gone += 1
            self._held.pop(key, None)
            self._retrying.discard(key)

    def _fly(self, sim_id: str, rank: int, flight: InFlight | None) -> None:
        """Set (or clear) what is in flight for a rank, and the indices."""
        key = (sim_id, rank)
        self._of(*key).inflight = flight
        if key in self._flying:
            del self._flying[key]
            left = self._flying_per_sim[sim_id] - 1
            if left:
                self._flying_per_sim[sim_id] = left
            else:
                del self._flying_per_sim[sim_id]
        self._shrinking.pop(key, None)
        if flight is not None:
            node = self._node(key)
            self._flying[key] = node
            self._flying_per_sim[sim_id] = self._flying_per_sim.get(sim_id, 0) + 1
            if flight.decrease:
                self._shrinking[key] = node
