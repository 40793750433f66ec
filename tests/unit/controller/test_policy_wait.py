"""(E) of the decision step: under ``wait="auto"`` a simulation spins while it has the cores
to itself and waits politely while it shares them; a switch is emitted only on change.

The clock is fake: it is only the ``now_s`` passed in the observations.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rankpack.controller.observations import (
    ControllerSettings,
    ControllerState,
    Decision,
    QueuedSim,
    SetWaitMode,
    SimMemory,
    SimSnapshot,
)
from rankpack.controller.policy import decide

from ._helpers import SIZED, S, observe, snap, state_of

FIXED = SimMemory(stage="fixed")


def auto(sim_id: str = "a", requests: tuple[int, ...] = (1000, 1000), **kw: object) -> SimSnapshot:
    return replace(snap(sim_id, requests), wait="auto", **kw)  # type: ignore[arg-type]


def switches(d: Decision) -> list[tuple[str, str]]:
    return [(a.sim_id, a.mode) for a in d.actions if isinstance(a, SetWaitMode)]


def test_alone_within_capacity_stays_in_its_launch_mode_spin() -> None:
    d = decide(observe(0.0, auto(), capacity=2000), state_of(a=FIXED), S)
    assert switches(d) == []
    assert d.state.sims["a"].wait_mode is None  # still the launch mode (spin)


def test_a_second_simulation_makes_both_polite_and_the_survivor_spins_again() -> None:
    a, b = auto("a", (500, 500)), auto("b", (500, 500))
    d1 = decide(observe(0.0, a, b, capacity=2000), state_of(a=FIXED, b=FIXED), S)
    assert sorted(switches(d1)) == [("a", "polite"), ("b", "polite")]
    reason = next(x.reason for x in d1.actions if isinstance(x, SetWaitMode) and x.sim_id == "a")
    assert "shares the cores with b" in reason and "spin -> polite" in reason
    # next step, same picture: nothing is emitted again (memory holds the mode)
    d2 = decide(observe(1.0, a, b, capacity=2000), d1.state, S)
    assert switches(d2) == []
    # b ended: a is alone again and goes back to spin, once
    d3 = decide(observe(2.0, a, capacity=2000), d2.state, S)
    assert switches(d3) == [("a", "spin")]
    assert "alone" in next(x.reason for x in d3.actions if isinstance(x, SetWaitMode))
    assert switches(decide(observe(3.0, a, capacity=2000), d3.state, S)) == []


def test_a_staging_neighbour_counts_as_sharing_but_is_not_switched_itself() -> None:
    staging = replace(auto("b"), starting=True, ranks=auto("b").ranks)
    d = decide(observe(0.0, auto("a", (500, 500)), staging, capacity=4000),
               state_of(a=FIXED), S)  # fmt: skip
    assert switches(d) == [("a", "polite")]


def test_a_launch_in_this_step_switches_the_running_one_at_once() -> None:
    queued = QueuedSim(queue_id=3, n_ranks=2, initial_request_millis=(500, 500))
    obs = observe(10.0, auto("a", (500, 500)), queue=[queued], capacity=4000)
    settings = ControllerSettings(min_predicted_gain=-1.0)
    d = decide(obs, state_of(a=SIZED), settings)
    assert any(type(x).__name__ == "Launch" for x in d.actions)
    assert switches(d) == [("a", "polite")]
    assert "being launched" in next(x.reason for x in d.actions if isinstance(x, SetWaitMode))


def test_requests_above_the_capacity_left_to_rankpack_mean_sharing() -> None:
    # other pods/cgroups took part of the node: 2000m requested on 1500m left
    d = decide(observe(0.0, auto(), capacity=1500, others=500), state_of(a=FIXED), S)
    assert switches(d) == [("a", "polite")]
    assert "exceed" in d.actions[0].reason  # type: ignore[union-attr]


def test_requests_above_the_node_with_nobody_else_on_it_still_spin() -> None:
    # `rankpack run pitzDaily --ranks 4`: 4 x 1000m on 2 cores, nothing else requests CPU.
    # Its own ranks wait for each other; polite made it 3.7x slower (benchmarks.md).
    d = decide(observe(0.0, auto("a", (1000,) * 4), capacity=2000), state_of(a=FIXED), S)
    assert switches(d) == []
    polite = replace(state_of(a=FIXED), sims={"a": replace(FIXED, wait_mode="polite")})
    d2 = decide(observe(1.0, auto("a", (1000,) * 4), capacity=2000), polite, S)
    assert switches(d2) == [("a", "spin")]
    assert "only its own ranks" in d2.actions[0].reason  # type: ignore[union-attr]


def test_more_ranks_than_cores_alone_still_spins() -> None:
    # 4 ranks x 500m on 2 cores: alone, requests within capacity -> spin (benchmarks.md)
    d = decide(observe(0.0, auto("a", (500,) * 4), capacity=2000), state_of(a=FIXED), S)
    assert switches(d) == []


@pytest.mark.parametrize("mode", ["spin", "polite", "adaptive"])
def test_a_fixed_mode_is_never_switched(mode: str) -> None:
    a = replace(snap("a", (500, 500)), wait=mode)
    b = replace(snap("b", (500, 500)), wait=mode)
    d = decide(observe(0.0, a, b, capacity=2000), state_of(a=FIXED, b=FIXED), S)
    assert switches(d) == []


def test_no_switch_before_every_rank_has_shim_data() -> None:
    a = auto("a", (500, 500))
    no_data = replace(a, ranks=(a.ranks[0], replace(a.ranks[1], compute_ns=None, mpi_ns=None)))
    d = decide(observe(0.0, no_data, auto("b", (500, 500)), capacity=2000),
               state_of(a=FIXED, b=FIXED), S)  # fmt: skip
    assert switches(d) == [("b", "polite")]
    # once a's ranks publish, a is switched too
    d2 = decide(observe(1.0, a, auto("b", (500, 500)), capacity=2000), d.state, S)
    assert switches(d2) == [("a", "polite")]


def test_decide_is_pure_for_wait_modes() -> None:
    obs = observe(0.0, auto("a", (500, 500)), auto("b", (500, 500)), capacity=2000)
    state = ControllerState()
    assert decide(obs, state, S) == decide(obs, state, S)
