"""What the controller's decision step can ask for: the action types.

Decided by `rankpack.controller.policy.decide`, carried out by the control loop through a
backend, recorded as events and rendered by the report. A simulation starts in two steps:
`StageJob` (claim its job, stage its case), then `Launch` once its case is staged (its
requests, nodes and wait mode as decided). There is no action that stops or relaunches a
rank: every CPU change is an in-place `Resize`, and a change of how ranks
wait inside MPI is a live `SetWaitMode` (the PMPI shim re-reads its control word on every
wait).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from rankpack.errors import UserError

ResizeKind = Literal["size", "fairness", "phase", "pack"]
"""Which part of the policy asked for a resize: duty-cycle sizing, fairness, the phase
schedule, or packing running simulations to make room for a launch."""


@dataclass(frozen=True)
class Resize:
    sim_id: str
    rank: int
    request_millis: int
    reason: str
    kind: ResizeKind = "size"


@dataclass(frozen=True)
class StageJob:
    """Claim a queued simulation's job and stage its case (the launch gate's decision); it
    is launched (`Launch`) in the step that first sees its case staged."""

    queue_id: int
    reason: str
    request_millis: tuple[int, ...] = ()
    """Per-rank requests to start with instead of the plan's (empty: the plan's); set when
    the running simulations were packed to make room for it."""
    nodes: tuple[str, ...] = ()
    """Per rank, the node it is placed on (`rankpack.controller.room.place`; the backend
    asks the scheduler for it); empty: no node decided (one node, or no placement fits),
    the scheduler places the ranks."""


WaitMode = Literal["spin", "polite", "adaptive"]
"""How a rank waits inside MPI (the PMPI shim's modes, ``docs/shim.md``)."""
WAIT_MODES: tuple[WaitMode, ...] = get_args(WaitMode)
"""The wait modes in the shim's order: a mode's index is its code in the shim's control word."""
WaitSetting = Literal["auto", WaitMode]
"""What a user asks for: a wait mode, or ``auto`` (the controller chooses per node load)."""
WAIT_SETTINGS: tuple[WaitSetting, ...] = get_args(WaitSetting)


class UnknownWaitMode(UserError):
    """A wait mode that is none of `WAIT_MODES` (backends raise it as their BackendError)."""


def parse_wait_mode(mode: str) -> WaitMode:
    """``mode`` as a `WaitMode`: the one check of a wait mode's name, for the CLI, the
    shim's settings, the record writers and every backend's ``set_wait_mode``."""
    for known in WAIT_MODES:
        if mode == known:
            return known
    raise UnknownWaitMode(f"unknown wait mode '{mode}'; use one of: {', '.join(WAIT_MODES)}")


@dataclass(frozen=True)
class RankWait:
    """The wait mode one rank got and why (the load of the node it sits on)."""

    rank: int
    node: str | None
    """None: not placed on a node yet."""
    mode: WaitMode
    why: str


@dataclass(frozen=True)
class WaitChoice:
    """The wait mode a simulation's ranks get, why, and the MPI library's idle yield."""

    mode: WaitMode
    reason: str
    ranks: tuple[RankWait, ...]
    idle_yield: bool
    """The MPI library's own yield while idle: off only where every rank spins on a core
    of its own."""


@dataclass(frozen=True)
class LaunchChange:
    """What changed a staged simulation's planned requests or nodes at its launch (recorded
    as an event of this ``kind``)."""

    kind: Literal["launch-fitted", "placement"]
    reason: str
    request_millis: tuple[int, ...] = ()
    """``launch-fitted``: the requests after the change."""
    nodes: tuple[str, ...] = ()
    """``placement``: the nodes after the change (empty: left to the scheduler)."""


@dataclass(frozen=True)
class Launch:
    """Start the ranks of a simulation whose case is staged, with what the decision step
    gave it (`rankpack.controller.staged`): the loop applies it as it is."""

    sim_id: str
    queue_id: int
    request_millis: tuple[int, ...]
    """Per rank, the request it starts with: its plan's, brought within what the namespace
    allows a rank and, when launches must fit, scaled to the unrequested capacity."""
    nodes: tuple[str, ...]
    """Per rank, its node (empty: the scheduler places the ranks)."""
    wait: WaitChoice
    """How its ranks wait from the start (the wait rule among what runs beside it)."""
    changes: tuple[LaunchChange, ...] = ()
    """What changed the planned requests or nodes, in order."""


@dataclass(frozen=True)
class SetWaitMode:
    """Switch every rank of a running simulation to ``mode``, live (no restart)."""

    sim_id: str
    mode: WaitMode
    reason: str
    ranks: tuple[RankWait, ...] = ()
    """Per rank: where it sits and why it gets ``mode``."""


@dataclass(frozen=True)
class Note:
    """Something worth recording that changes nothing (profiling started, launch held back)."""

    sim_id: str | None
    kind: str
    reason: str
    code: str = ""
    """A machine-readable reason (``launch-held``: ``cooldown``, ``max-concurrent``,
    ``no-room``, ``quota``, ``no-gain``), recorded as the event's ``code`` when set."""
    queue_id: int | None = None
    """The queued simulation it is about (``launch-held``: the head that waits)."""


Action = Resize | StageJob | Launch | SetWaitMode | Note
