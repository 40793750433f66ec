"""What the controller's decision step can ask for: the action types.

Decided by `rankpack.controller.policy.decide`, carried out by the control loop through a
backend, recorded as events and rendered by the report. There is no action that stops or
relaunches a rank: every CPU change is an in-place `Resize`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Resize:
    sim_id: str
    rank: int
    request_millis: int
    reason: str
    kind: Literal["size", "fairness", "phase"] = "size"


@dataclass(frozen=True)
class Launch:
    queue_id: int
    reason: str


@dataclass(frozen=True)
class Note:
    """Something worth recording that changes nothing (profiling started, launch held back)."""

    sim_id: str | None
    kind: str
    reason: str


Action = Resize | Launch | Note
