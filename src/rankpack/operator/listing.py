"""A listing of the served namespaces' Simulations, as the queue reads it: `Listing`.

Each listed Simulation (`Listed`) carries its key (`simapi.simulation_key`), its namespace
and its phase. Made by `rankpack.operator.queue.SimulationQueue.listing` from
`SimulationApi.list`; read by the queue (what is pending, idle, withdrawn), its arrivals
(`rankpack.operator.arrivals`) and adoption (`rankpack.operator.adoption`). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from rankpack.operator.simapi import simulation_key

Obj = dict[str, Any]


@dataclass(frozen=True)
class Listed:
    """One Simulation of a listing."""

    obj: Obj
    key: str
    namespace: str
    phase: str | None
    """As listed, or as its arrival made it (`Queued`, `Failed`: `Listing.with_phases`)."""

    @property
    def status(self) -> Obj:
        return self.obj.get("status") or {}

    @property
    def uid(self) -> str:
        return str((self.obj.get("metadata") or {}).get("uid") or "")


@dataclass(frozen=True)
class Listing:
    """The Simulations of one listing that succeeded, in the order listed."""

    items: tuple[Listed, ...]

    @classmethod
    def of(cls, objs: Sequence[Obj], several: bool, namespace: str) -> Listing:
        """``objs`` as listed; ``several``: several namespaces are served (keys name theirs);
        ``namespace``: the one an object without a namespace is in."""
        return cls(tuple(
            Listed(obj, simulation_key(obj, several),
                   str((obj.get("metadata") or {}).get("namespace") or namespace),
                   (obj.get("status") or {}).get("phase"))
            for obj in objs
        ))  # fmt: skip

    def uids(self) -> dict[str, str]:
        """Key -> uid of every Simulation listed."""
        return {item.key: item.uid for item in self.items}

    def oldest_first(self) -> list[Listed]:
        return sorted(self.items, key=lambda i: (
            i.obj["metadata"].get("creationTimestamp", ""), i.obj["metadata"]["name"]))  # fmt: skip

    def counts(self, *phases: str) -> dict[str, int]:
        """Per namespace: the Simulations in one of ``phases``."""
        counts: dict[str, int] = {}
        for item in self.items:
            if item.phase in phases:
                counts[item.namespace] = counts.get(item.namespace, 0) + 1
        return counts

    def with_phases(self, phases: dict[str, str]) -> Listing:
        """This listing with the phases of the keys in ``phases`` replaced (what arrivals
        made of them)."""
        if not phases:
            return self
        return Listing(tuple(
            replace(i, phase=phases[i.key]) if i.key in phases else i for i in self.items
        ))  # fmt: skip
