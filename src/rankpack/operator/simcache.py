"""The operator's Simulations, listed once and then watched: `SimulationCache` (issue 29).

The queue of Simulations (`queue.SimulationQueue`) reads them every tick; through this cache
that costs the apiserver nothing: each namespace's Simulations are one informer of the
backend's shared cache (`backend.kubernetes.informer`), listed at start and watched from
then on (resourceVersion, bookmarks, a List again only on ``410 Gone``). A change wakes the
control loop (`on_change`). The operator's own status writes are taken in as they return
(`saw`), so the next tick reads them even before their watch event arrives.

It serves a set of namespaces: one watch per namespace (what a Role per namespace allows),
or, given ``None``, one watch of the Simulations of every namespace (a ClusterRole).
While a watch is broken (the apiserver went away) `list` raises as a List would: the queue
hands out no new work and is not idle until it is back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rankpack.backend.kubernetes.api.informer import Cache, Collection, Informer
from rankpack.backend.kubernetes.api.kubeapi import ApiError, Obj
from rankpack.operator import crd


def collection(namespace: str | None) -> Collection:
    """The Simulations of one namespace (None: of every namespace)."""
    where = f"/namespaces/{namespace}" if namespace else ""
    return Collection(f"/apis/{crd.GROUP}/{crd.VERSION}{where}/{crd.PLURAL}")


class SimulationCache:
    """The Simulations of ``namespaces`` (None: all) from ``cache`` (see the module doc)."""

    def __init__(self, cache: Cache, namespaces: Iterable[str] | None) -> None:
        self.cache = cache
        self.namespaces = None if namespaces is None else frozenset(namespaces)
        self.collections = (
            [collection(None)]
            if self.namespaces is None
            else [collection(ns) for ns in sorted(self.namespaces)]
        )
        self._listeners: list[Callable[[], None]] = []

    def start(self) -> None:
        """List each collection (an `ApiError` if one cannot be listed: the CRD is missing,
        the identity may not) and watch it from then on."""
        for c in self.collections:
            inf = self.cache.informer(c)
            if inf.forbidden:
                raise ApiError(403, "Forbidden", f"{c.path} may not be listed")
            if self._wake not in inf.listeners:
                inf.listeners.append(self._wake)

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (no arguments) after every change of a Simulation."""
        self._listeners.append(listener)

    def _wake(self, kind: str, obj: Obj) -> None:
        for listener in list(self._listeners):
            listener()

    def _informers(self) -> list[Informer]:
        return [self.cache.informer(c) for c in self.collections]

    def list(self) -> list[Obj]:
        """Every Simulation held (not to be changed); an `ApiError` while a watch is broken
        (what a List would have answered)."""
        out: list[Obj] = []
        for inf in self._informers():
            if inf.error is not None:
                raise ApiError(0, "Unreachable", f"watch on {inf.collection}: {inf.error}")
            out += [o for o in inf.items() if self._ours(o)]
        return out

    def _ours(self, obj: Obj) -> bool:
        if self.namespaces is None:
            return True
        return str((obj.get("metadata") or {}).get("namespace") or "") in self.namespaces

    def saw(self, obj: Obj) -> None:
        """A Simulation as this process's write returned it (`Informer.saw`)."""
        ns = str((obj.get("metadata") or {}).get("namespace") or "")
        c = collection(None if self.namespaces is None else ns)
        if c in self.collections:
            self.cache.informer(c).saw(obj)
