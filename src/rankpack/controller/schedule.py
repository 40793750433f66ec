"""Which simulations a tick observes (the control loop's first step).

A simulation the loop must follow closely is observed every tick: staging (it launches
once staged), with a resize in flight, held or due again, a wait-mode switch refused,
readings that were stale, or news from the backend (a backend that says which simulations
changed, `Changes`: the simulated one does). The others are observed in turn within
``LoopSettings.observe_ranks_per_tick`` ranks a tick: first those about to cross a
threshold the policy acts on (starting, in warm-up or profiling, following a phase
schedule), then the steady ones (sized or fixed), each group least recently observed
first; none goes unobserved for more than ``observe_max_age_s``. While all of them hold
fewer ranks than the budget (any single node, and a cluster of some hundred ranks) every
simulation is observed every tick, as it always was; on a cluster of ten thousand ranks a
tick costs what must be followed plus a slice of the rest, and a simulation is not decided
on again until it is observed (`rankpack.controller.policy`: a snapshot keeps the step it
was observed for).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol, runtime_checkable

from rankpack.controller.tracked import Tracked


@runtime_checkable
class Changes(Protocol):
    """A backend that says which of its simulations have news (a phase, a resize's state,
    a restart) since it was last asked."""

    def changed(self) -> Collection[str]: ...


class Schedule:
    """The loop's observation schedule (see the module docstring)."""

    def __init__(self, budget_ranks: int, max_age_s: float) -> None:
        self.budget_ranks = budget_ranks
        self.max_age_s = max_age_s
        self.seen: dict[str, float] = {}
        """When each simulation was last observed (the loop's clock)."""

    def pick(
        self,
        sims: Mapping[str, Tracked],
        urgent: Collection[str],
        active: Collection[str],
        now_s: float,
    ) -> list[Tracked]:
        """The simulations to observe now, in the loop's order: all of ``urgent``, then
        ``active`` ones and then the others in turn, within the budget."""
        total = sum(len(s.plan.ranks) for s in sims.values())
        if total <= self.budget_ranks:
            chosen = list(sims.values())
        else:
            left = self.budget_ranks - sum(
                len(s.plan.ranks) for s in sims.values() if s.sim_id in urgent
            )
            rest = sorted(
                (s for s in sims.values() if s.sim_id not in urgent),
                key=lambda s: (s.sim_id not in active, self.seen.get(s.sim_id, -1.0)),
            )
            picked: set[str] = set()
            for s in rest:
                old = now_s - self.seen.get(s.sim_id, -1.0) >= self.max_age_s
                if left < len(s.plan.ranks) and (picked or left < 0) and not old:
                    continue
                picked.add(s.sim_id)
                left -= len(s.plan.ranks)
            chosen = [s for s in sims.values() if s.sim_id in urgent or s.sim_id in picked]
        for s in chosen:
            self.seen[s.sim_id] = now_s
        for gone in [i for i in self.seen if i not in sims]:
            del self.seen[gone]
        return chosen
