"""Duty-cycle arithmetic of seed 001 eqs. 1-3."""

from __future__ import annotations

import pytest

from rankpack.profile.duty import (
    CallEvent,
    Counters,
    duty_between,
    iteration_duties,
    reclaimable_millis,
    steady_state_duty,
    steady_state_iteration_duty,
    steady_state_start,
    window_duties,
)


def test_duty_between_is_compute_over_total() -> None:
    a = Counters(0, 100, 200)
    b = Counters(10, 400, 1100)
    assert duty_between(a, b) == pytest.approx(300 / 1200)


def test_duty_between_no_time_is_none() -> None:
    a = Counters(0, 5, 5)
    assert duty_between(a, a) is None


def test_duty_between_rejects_decreasing_counters() -> None:
    with pytest.raises(ValueError):
        duty_between(Counters(1, 10, 10), Counters(2, 5, 20))


def test_steady_state_skips_start_and_is_time_weighted() -> None:
    # First second all MPI (start-up), then 1 s compute per 3 s: the skipped part must not count.
    samples = [Counters(0, 0, 0), Counters(1_000, 0, 1_000)]
    for k in range(1, 10):
        samples.append(Counters(1_000 + 3_000 * k, 1_000 * k, 1_000 + 2_000 * k))
    assert steady_state_start(samples, 0.1) == 2
    assert steady_state_duty(samples, 0.1) == pytest.approx(1 / 3)
    assert steady_state_duty(samples, 0.0) == pytest.approx(9_000 / 28_000)


def test_window_duties() -> None:
    samples = [Counters(0, 0, 0), Counters(10, 5, 5), Counters(20, 6, 14)]
    assert window_duties(samples) == [pytest.approx(0.5), pytest.approx(0.1)]


def test_iteration_duties_overlap_calls_with_iterations() -> None:
    events = [
        CallEvent(0, "MPI_Allreduce", 8.0, 10.0),  # iteration 0: 2 us MPI of 10
        CallEvent(0, "MPI_Waitall", 18.0, 22.0),  # spans the boundary at 20
        CallEvent(0, "MPI_Allreduce", 29.0, 30.0),
    ]
    per_it = iteration_duties(events, [0.0, 10.0, 20.0, 30.0])
    assert per_it == [
        pytest.approx((8.0, 2.0)),
        pytest.approx((8.0, 2.0)),
        pytest.approx((7.0, 3.0)),
    ]
    assert steady_state_iteration_duty(per_it, 0.34) == pytest.approx(15 / 20)


def test_iteration_duties_reject_unsorted_boundaries() -> None:
    with pytest.raises(ValueError):
        iteration_duties([], [0.0, 2.0, 1.0])


def test_reclaimable_is_request_times_idle_fraction() -> None:
    per_rank, total = reclaimable_millis([100, 500, 1500], [0.05, 0.2, None])
    assert per_rank == [pytest.approx(95.0), pytest.approx(400.0), 0.0]
    assert total == pytest.approx(495.0)
    with pytest.raises(ValueError):
        reclaimable_millis([1], [0.5, 0.5])
