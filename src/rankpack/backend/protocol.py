"""The interface every backend implements, and the typed values that cross it.

The run driver and the multiplexing controller only see these types, so the local backend
(one cgroup per rank) and a Kubernetes backend (one pod per rank, resized through
``pods/resize``) are interchangeable. Backends carry out actions; they decide nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class RankResources:
    """A rank pod's CPU: the request (scheduling weight) and an optional hard limit."""

    request_millis: int
    limit_millis: int | None = None


@dataclass(frozen=True)
class SimSpec:
    """Everything a backend needs to start one MPI simulation."""

    sim_id: str
    """Unique within the database, e.g. ``run-12``; names the rank pods / cgroups."""
    case_dir: Path
    """The prepared (meshed, decomposed) case; the working directory of every rank."""
    command: tuple[str, ...]
    """The program each rank runs, e.g. ``("simpleFoam", "-parallel")``; no launcher."""
    ranks: tuple[RankResources, ...]
    log_path: Path
    """Where the MPI job's stdout and stderr go (rank 0 prints the solver log)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for every rank (e.g. the PMPI shim's variables)."""


@dataclass(frozen=True)
class RankObservation:
    rank: int
    usage_ns: int
    """Cumulative CPU time of the rank pod."""
    nr_throttled: int
    throttled_ns: int
    request_millis: int
    limit_millis: int | None


@dataclass(frozen=True)
class SimObservation:
    sim_id: str
    t_s: float
    """Monotonic seconds when the counters were read."""
    ranks: tuple[RankObservation, ...]
    exit_code: int | None
    """None while running; the MPI launcher's exit code once it has ended."""


class SimHandle(Protocol):
    sim_id: str


class Backend(Protocol):
    name: str

    def capacity_millis(self) -> int:
        """Allocatable CPU of the node(s) this backend places ranks on."""
        ...

    def launch(self, spec: SimSpec) -> SimHandle: ...

    def resize(self, handle: SimHandle, rank: int, resources: RankResources) -> None:
        """Change one rank's CPU in place; the rank keeps running."""
        ...

    def observe(self, handle: SimHandle) -> SimObservation: ...

    def wait(self, handle: SimHandle, timeout_s: float) -> int | None:
        """Block up to ``timeout_s`` for the simulation to end; its exit code, or None."""
        ...

    def stop(self, handle: SimHandle) -> None:
        """Terminate every process of the simulation (idempotent)."""
        ...

    def release(self, handle: SimHandle) -> None:
        """Remove what `launch` created (cgroups, pods); call after the final `observe`."""
        ...
