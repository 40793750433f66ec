"""The decision step within what the namespace allows (issue 26, item 5): a LimitRange's
min and max bound every rank's request, a grow the ResourceQuota does not allow is held
with the code ``quota`` (never sent to be refused), and a job whose launch the quota
refused waits out its back-off. Pure: the clock is the ``now_s`` of the observations."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rankpack.controller.decision import (
    ControllerSettings,
    ControllerState,
    QueuedSim,
    SimMemory,
)
from rankpack.controller.policy import decide, requeue_delay_s, within_bounds

from ._helpers import S, apply, launches, notes, observe, resizes, snap, state_of
from .test_policy import profiled, profiling_state

LIMIT_RANGE = "LimitRange lr (Container cpu: min 100m, max 600m)"


def test_the_floor_is_raised_to_the_limit_ranges_min_never_above_its_max() -> None:
    obs = observe(0.0)
    assert within_bounds(S, obs) is S
    assert within_bounds(S, replace(obs, rank_min_millis=100)).floor_millis == 100
    assert within_bounds(S, replace(obs, rank_min_millis=30)).floor_millis == S.floor_millis
    empty = replace(obs, rank_min_millis=700, rank_max_millis=600)
    assert within_bounds(S, empty).floor_millis == 600


def test_sizing_keeps_every_rank_within_the_limit_range() -> None:
    # duty 0.02 -> 25m wanted (below min 100m); duty 1 -> 1250m wanted (above max 600m)
    sim = profiled(5.0, (0.1, 5, 5), (4.9, 0, 0), (1, 1, 1), (300, 300, 300))
    obs = replace(observe(15.0, sim), rank_min_millis=100, rank_max_millis=600,
                  rank_bounds=LIMIT_RANGE)  # fmt: skip
    d = decide(obs, profiling_state(10.0), S)
    after = apply([sim], d.actions)[0]
    assert [r.request_millis for r in after.ranks] == [100, 600, 600]
    assert "capped at 600m by LimitRange lr" in resizes(d)[-1].reason


def test_fairness_never_raises_a_rank_above_the_limit_ranges_max() -> None:
    slow = snap("a", (600, 600), iterations=10)
    fast = snap("b", (300, 300), iterations=50)
    marks_a = ((0.0, 0), (6.0, 10))
    marks_b = ((0.0, 0), (6.0, 50))
    state = state_of(
        a=SimMemory(stage="sized", duty=(0.5, 0.5), rate_marks=marks_a),
        b=SimMemory(stage="sized", duty=(0.5, 0.5), rate_marks=marks_b),
    )
    obs = replace(observe(6.0, slow, fast, capacity=8000), rank_max_millis=600,
                  rank_bounds=LIMIT_RANGE)  # fmt: skip
    assert {r.sim_id for r in resizes(decide(replace(obs, rank_max_millis=None), state, S))} == {
        "a"
    }  # without the bound, a would be raised
    d = decide(obs, state, S)
    assert {r.sim_id for r in resizes(d)} == {"b"}  # a is at its max: b is lowered instead
    assert all(r.request_millis <= 600 for r in resizes(d))


def test_a_grow_the_quota_does_not_allow_is_capped_and_noted_with_the_quota_code() -> None:
    # wants 1250m x 3; 3000m requested, 500m left under the quota
    sim = profiled(5.0, (5, 5, 5), (0, 0, 0), (1, 1, 1), (1000,) * 3)
    bound = "the namespace's ResourceQuota q (requests.cpu 3500m, 3000m used)"
    obs = replace(observe(15.0, sim, capacity=3500), capacity_bound=bound)
    d = decide(obs, profiling_state(10.0), S)
    assert sum(r.request_millis for r in apply([sim], d.actions)[0].ranks) == 3500
    (capped,) = notes(d, "resize-capped")
    assert capped.code == "quota" and capped.sim_id == "a"
    assert "wanted 3750m, 3500m fit: grows held within the namespace's ResourceQuota q" in (
        capped.reason
    )


def test_a_cap_by_the_nodes_is_not_a_quota_hold() -> None:
    sim = profiled(5.0, (5, 5, 5), (0, 0, 0), (1, 1, 1), (1000,) * 3)
    d = decide(observe(15.0, sim, capacity=3500), profiling_state(10.0), S)
    assert not notes(d, "resize-capped")


def test_floors_the_quota_does_not_leave_room_for_say_quota() -> None:
    sim = profiled(5.0, (5, 5, 5), (0, 0, 0), (1, 1, 1), (40, 40, 40), budget=8000)
    obs = replace(observe(15.0, sim, capacity=100), capacity_bound="the namespace's quota q")
    d = decide(obs, profiling_state(10.0), S)
    (skipped,) = notes(d, "resize-skipped")
    assert skipped.code == "quota" and "the namespace's quota q" in skipped.reason


GATE = ControllerSettings(gate="duty", min_predicted_gain=-1.0, launch_cooldown_s=0.0)


def test_a_job_whose_launch_the_quota_refused_waits_out_its_back_off() -> None:
    refused = QueuedSim(queue_id=1, n_ranks=2, initial_request_millis=(500, 500),
                        retry_at_s=12.0, retry_reason="exceeded quota: q")  # fmt: skip
    d = decide(observe(10.0, queue=[refused]), ControllerState(), GATE)
    assert launches(d) == []
    (held,) = notes(d, "launch-held")
    assert held.code == "quota" and held.queue_id == 1
    assert "refused at launch (exceeded quota: q); tried again in 2 s" in held.reason
    d = decide(observe(12.0, queue=[refused]), d.state, GATE)
    assert [x.queue_id for x in launches(d)] == [1]


def test_backfill_passes_a_job_in_its_quota_back_off() -> None:
    refused = QueuedSim(queue_id=1, n_ranks=2, initial_request_millis=(500, 500),
                        retry_at_s=30.0, retry_reason="exceeded quota: q")  # fmt: skip
    small = QueuedSim(queue_id=2, n_ranks=1, initial_request_millis=(300,))
    d = decide(observe(10.0, queue=[refused, small]), ControllerState(), GATE)
    assert [x.queue_id for x in launches(d)] == [2]


@pytest.mark.parametrize(("attempt", "delay"), [(0, 2.0), (1, 4.0), (3, 16.0), (4, 30.0),
                                                 (50, 30.0)])  # fmt: skip
def test_the_requeue_back_off_doubles_and_is_never_given_up(attempt: int, delay: float) -> None:
    assert requeue_delay_s(attempt) == delay
