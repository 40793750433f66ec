"""What each step writes into a Simulation's status (`transitions`): a run's code."""

from __future__ import annotations

import pytest

from rankpack.core.failures import FailureCode
from rankpack.operator import transitions


@pytest.mark.parametrize(
    ("failure", "code"),
    [("PodDeleted", FailureCode.POD_DELETED), ("OOMKilled", FailureCode.OOM_KILLED),
     (None, FailureCode.OTHER), ("NoSuchCode", FailureCode.OTHER)],
)  # fmt: skip
def test_a_runs_code_is_read_from_its_result(failure: str | None, code: FailureCode) -> None:
    class Row:  # a run's result: `RunResult.failure` as recorded
        def __init__(self, failure: str | None) -> None:
            self.failure = failure

    assert transitions.failure_code(Row(failure))  # type: ignore[arg-type] is code
