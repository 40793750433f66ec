"""The launch gate with beta fitted from this machine's recorded sessions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rankpack.controller.decision import QueuedSim
from rankpack.controller.policy import decide
from rankpack.controller.session import fitted_beta_from_sessions
from rankpack.store import SessionRow

from ._helpers import GIGA, SIZED, S, launches, notes, observe, snap, state_of


def _decide(beta: float | None, duty: float = 0.1, gate: str = "beta"):  # type: ignore[no-untyped-def]
    duty_ns = round(duty * GIGA)
    sim = snap(requests=(250,) * 4, compute_ns=(duty_ns,) * 4, mpi_ns=(GIGA - duty_ns,) * 4)
    state = state_of(a=replace(SIZED, duty=(duty,) * 4))
    queue = (QueuedSim(7, 4, (250,) * 4),)
    settings = replace(S, fitted_beta=beta, gate=gate)
    return decide(observe(100.0, sim, queue=queue, capacity=2000), state, settings)


def test_fitted_beta_overrides_an_optimistic_duty_model() -> None:
    # low duty: the duty-cycle model alone would launch
    assert launches(_decide(None, gate="duty"))
    # 4 ranks on 2 CPUs: delta rho = 2; beta 0.91 (Theta(2) = 0.71, measured here) -> no gain
    held = _decide(0.91)
    assert not launches(held)
    (note,) = notes(held, "launch-held")
    assert "linear contention model" in note.reason and "0.910" in note.reason
    # no contention measured: the fitted model predicts the full gain
    ok = _decide(0.0)
    assert launches(ok)
    assert "linear contention model" in ok.actions[-1].reason


def _session_row(n: int, makespan: float, t1: float, *, ranks: int = 4, cap: int = 2000,
             wait: str = "spin", status: str = "completed") -> SessionRow:  # fmt: skip
    sims = [{"status": "completed", "n_ranks": ranks} for _ in range(n)]
    return SessionRow(
        id=1, started_at="", finished_at=None, status=status, owner_pid=None,
        capacity_millis=cap, max_concurrent=n, wait_mode=wait, backend="local",
        summary={"makespan_s": makespan, "sequential_s": n * t1, "simulations": sims},
    )  # fmt: skip


def test_beta_from_comparable_sessions_only() -> None:
    # Theta(2) = 2 * 10 / 28.17 = 0.71 with delta rho = (2 - 1) * 4 / 2 = 2 -> beta ~ 0.91
    sessions = [
        _session_row(2, 28.17, 10.0),
        _session_row(2, 5.0, 10.0, wait="polite"),  # other wait mode: ignored
        _session_row(2, 5.0, 10.0, ranks=2),  # other ranks: ignored
        _session_row(2, 5.0, 10.0, cap=4000),  # other capacity: ignored
        _session_row(3, 1.0, 10.0, status="interrupted"),  # not completed: ignored
    ]
    beta = fitted_beta_from_sessions(sessions, capacity_millis=2000, wait_mode="spin", n_ranks=4)
    assert beta == pytest.approx((2 * 28.17 / 20.0 - 1) / 2, rel=1e-3)


def test_no_beta_without_two_distinct_n() -> None:
    assert fitted_beta_from_sessions([], capacity_millis=2000, wait_mode="spin", n_ranks=4) is None
    one = [_session_row(1, 10.0, 10.0)]
    assert fitted_beta_from_sessions(one, capacity_millis=2000, wait_mode="spin", n_ranks=4) is None
