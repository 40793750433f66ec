"""How often a staged run writes its fields (`openfoam.write_steps`): about every tenth of
its iterations, the last step always written, so that a run a lost node cut short resumes
from a recent write (issue 28, item 4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankpack.case.openfoam import write_steps


@pytest.mark.parametrize(
    ("iterations", "case_steps", "expected"),
    [
        (250, 100, 25),  # pitzDaily's 100 does not divide 250: every 25 (10 writes)
        (300, 100, 30),  # 100 divides 300 but writes only 3 times: every 30
        (2000, 100, 100),  # the case's own every 5 %: kept
        (1000, 50, 50),
        (400, None, 40),  # not in time steps (a run-time control): every 40 steps
        (97, 100, 97),  # a prime count: one write, at the end (it would restart from 0)
        (1, 1, 1),
        (10, 3, 1),  # every step: 10 % of 10
        (36, 100, 4),  # 10 % is 3.6: the divisor nearest it
    ],
)
def test_write_steps(iterations: int, case_steps: float | None, expected: int) -> None:
    assert write_steps(iterations, case_steps) == expected


@given(st.integers(min_value=1, max_value=5000), st.integers(min_value=1, max_value=500))
def test_the_last_step_is_always_written_and_writes_are_periodic(
    iterations: int, case_steps: int
) -> None:
    steps = write_steps(iterations, case_steps)
    assert iterations % steps == 0  # the last step is a write
    # at least every 20 % of the run, unless no divisor lies near 10 % (then only the end)
    assert steps <= max(1, iterations * 0.2) or steps == iterations
