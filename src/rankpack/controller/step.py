"""The working state of one decision step (`rankpack.controller.policy.decide`).

A step starts from the requests observed and applies each action it emits to them, so
every rule after the first sees the requests as the earlier rules of the same step left
them (sizing, then fairness, then the launch gate, see `rankpack.controller.gate`). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rankpack.controller.decision import (
    ControllerSettings,
    Observations,
    RankReading,
    SimSnapshot,
)
from rankpack.core.actions import Action, Resize, ResizeKind


class _Requests(dict[str, list[int]]):
    """Each simulation's requests, read from its snapshot the first time they are asked for
    (a step touches the requests of the simulations it decides on, not of all of them)."""

    def __init__(self, sims: Mapping[str, SimSnapshot]) -> None:
        super().__init__()
        self._sims = sims

    def __missing__(self, sim_id: str) -> list[int]:
        value = [r.request_millis for r in self._sims[sim_id].ranks]
        self[sim_id] = value
        return value


@dataclass
class Step:
    """The requests as they stand after the actions emitted so far in this step."""

    obs: Observations
    settings: ControllerSettings
    actions: list[Action] = field(default_factory=list)
    requests: dict[str, list[int]] = field(init=False)
    resized: bool = False
    requested_millis: int = field(init=False)
    """What every simulation requests after this step's actions so far."""
    memo: dict[str, object] = field(default_factory=dict)
    """What a rule computed once for the whole step (the limit gate's loads)."""
    sims: dict[str, SimSnapshot] = field(init=False)
    """The simulations of the observations, by id."""
    waiting: list[Resize] = field(default_factory=list)
    """Resizes decided in an earlier step and not sent yet (`rankpack.controller.pacing`)."""
    waiting_ranks: list[RankReading] = field(default_factory=list)
    """The rank each of ``waiting`` resizes, as observed (read once a step)."""
    resize_room: Callable[[Mapping[str | None, int]], bool] = lambda per_node: True
    """Whether so many resizes (per node) may go out in this step (the pacer's buckets)."""

    def __post_init__(self) -> None:
        self.sims = {s.sim_id: s for s in self.obs.sims}
        self.requests = _Requests(self.sims)
        self.requested_millis = sum(s.requested_millis for s in self.obs.sims)

    def queued(self, resizes: Sequence[Resize]) -> None:
        """Resizes decided before and not sent yet: the rules see their targets as the
        requests; the capacity counts the larger of the target and what the rank has (a
        decrease frees nothing until it is sent, an increase holds its room)."""
        for a in resizes:
            sim = self.sims.get(a.sim_id)
            if sim is None or a.rank >= len(sim.ranks):
                continue  # it ended: forgotten
            rank = sim.ranks[a.rank]
            had = rank.request_millis
            if had == a.request_millis:
                continue  # it has it already
            current = self.requests[a.sim_id]
            self.requested_millis += max(had, a.request_millis) - current[a.rank]
            current[a.rank] = a.request_millis
            self.waiting.append(a)
            self.waiting_ranks.append(rank)

    def unrequested(self) -> int:
        return self.obs.capacity_millis - self.requested_millis

    def total(self, sim_id: str) -> int:
        return sum(self.requests[sim_id])

    def requests_of(self, sim: SimSnapshot) -> list[int]:
        return self.requests[sim.sim_id]

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
            self.requested_millis += targets[i] - current[i]
            current[i] = targets[i]
        if changed:
            self.resized = True
        return len(changed)


def has_shim(sim: SimSnapshot) -> bool:
    """Every rank has published the shim's live record (duty cycles can be measured)."""
    return sim.shim
