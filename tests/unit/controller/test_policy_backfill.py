"""Backfill behind a head that does not fit (issue 26, item 6): smaller simulations start
ahead of it while it waits, up to ``backfill_wait_s``; then nothing more starts before it.
The clock is fake: only the ``now_s`` passed in the observations."""

from __future__ import annotations

from dataclasses import replace

from rankpack.controller.decision import ControllerSettings, QueuedSim
from rankpack.controller.policy import decide

from ._helpers import SIZED, launches, notes, observe, snap, state_of

# the duty gate launches only what fits (no packing), and any gain will do
S = ControllerSettings(gate="duty", min_predicted_gain=-1.0, launch_cooldown_s=0.0,
                       backfill_wait_s=60.0)  # fmt: skip
RUNNING = snap("a", (750, 750))  # 1500m of 2000m requested
WIDE = QueuedSim(queue_id=1, n_ranks=4, initial_request_millis=(500,) * 4)  # 2000m
NARROW = QueuedSim(queue_id=2, n_ranks=1, initial_request_millis=(400,))
TOO_BIG = QueuedSim(queue_id=3, n_ranks=2, initial_request_millis=(400, 400))


def test_a_narrow_simulation_starts_ahead_of_a_wide_head_that_does_not_fit() -> None:
    d = decide(observe(10.0, RUNNING, queue=[WIDE, TOO_BIG, NARROW], capacity=2000),
               state_of(a=SIZED), S)  # fmt: skip
    (launch,) = launches(d)
    assert launch.queue_id == NARROW.queue_id
    assert launch.reason.startswith("backfill:") and "queued simulation 1 needs 2000m" in (
        launch.reason
    )
    # the head's hold is recorded, with its code, once
    (held,) = notes(d, "launch-held")
    assert held.code == "no-room" and "queued simulation 1" in held.reason
    assert d.state.head_no_room == (WIDE.queue_id, 10.0)


def test_the_head_keeps_its_age_and_after_backfill_wait_s_nothing_passes_it() -> None:
    state = replace(state_of(a=SIZED), head_no_room=(WIDE.queue_id, 10.0), launch_held="no-room")
    obs = observe(69.0, RUNNING, queue=[WIDE, NARROW], capacity=2000)
    d = decide(obs, state, S)
    assert [x.queue_id for x in launches(d)] == [NARROW.queue_id]
    assert d.state.head_no_room == (WIDE.queue_id, 10.0)  # the age is kept, not reset
    d = decide(replace(obs, now_s=70.0), state, S)
    assert launches(d) == []
    assert d.state.head_no_room == (WIDE.queue_id, 10.0)


def test_strict_fifo_with_backfill_wait_zero() -> None:
    d = decide(observe(10.0, RUNNING, queue=[WIDE, NARROW], capacity=2000),
               state_of(a=SIZED), replace(S, backfill_wait_s=0.0))  # fmt: skip
    assert launches(d) == []


def test_a_new_head_starts_its_own_wait() -> None:
    state = replace(state_of(a=SIZED), head_no_room=(99, 0.0))
    d = decide(observe(500.0, RUNNING, queue=[WIDE, NARROW], capacity=2000), state, S)
    assert [x.queue_id for x in launches(d)] == [NARROW.queue_id]
    assert d.state.head_no_room == (WIDE.queue_id, 500.0)


def test_a_head_that_fits_is_launched_and_forgets_its_wait() -> None:
    state = replace(state_of(), head_no_room=(WIDE.queue_id, 0.0))
    d = decide(observe(5.0, queue=[WIDE, NARROW], capacity=2000), state, S)
    assert [x.queue_id for x in launches(d)] == [WIDE.queue_id]
    assert d.state.head_no_room is None


def test_a_head_held_by_the_namespace_quota_says_so_and_smaller_ones_pass() -> None:
    bound = "the namespace's ResourceQuota q (requests.cpu 1200m, 1200m used)"
    obs = replace(observe(10.0, RUNNING, queue=[WIDE, NARROW], capacity=2000),
                  capacity_bound=bound)  # fmt: skip
    d = decide(obs, state_of(a=SIZED), S)
    (held,) = notes(d, "launch-held")
    assert held.code == "quota" and held.queue_id == WIDE.queue_id
    assert held.reason.endswith(f"held within {bound}")
    assert [x.queue_id for x in launches(d)] == [NARROW.queue_id]
