"""The Simulations' status writes: `StatusOutbox`, coalesced and kept while the apiserver is
away.

Every status write of the operator goes through `StatusOutbox.patch`: the queue's
(`rankpack.operator.queue`: arrival, holds, claim, launch, requeue, end) and the progress
of `rankpack.operator.status.StatusWriter`. A change of phase or a launch (`URGENT`) is
written at once, with whatever else waits for that Simulation; anything else (progress,
holds, conditions) at most once per Simulation per ``interval_s`` (merged meanwhile, last
write wins per field, and written by `flush`, every tick; issue 29). A patch that fails is
kept and written when the apiserver answers again. Conditions are one per type, and keep
their transition time while their status does not change (`set_conditions`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from rankpack.backend.kubernetes.api.kubeapi import ApiError, NotFound
from rankpack.operator.simapi import SimulationApi, first_line

Obj = dict[str, Any]

URGENT = ("phase", "simId")
"""Status fields written at once (a phase change, a launch); others are coalesced."""


class StatusOutbox:
    """The status patches of the Simulations, by key (see the module doc)."""

    def __init__(
        self,
        api: SimulationApi,
        interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.interval_s = interval_s
        """At most one status patch per Simulation per this many seconds, but `URGENT` ones."""
        self.clock = clock
        self.api_error: str | None = None
        """Why the last write failed (None: the last write succeeded)."""
        self._waiting: dict[str, Obj] = {}
        """Simulation key -> what is not written yet (coalesced, or the apiserver did not
        answer)."""
        self._written: dict[str, float] = {}
        """Simulation key -> when its status was last written (`clock`)."""
        self._conditions: dict[str, list[Obj]] = {}
        """Simulation key -> its conditions as last written (one per type)."""
        self._lock = threading.Lock()

    # -- conditions ----------------------------------------------------------------------------

    def seed(self, key: str, conditions: Iterable[Obj]) -> None:
        """Its conditions as the Simulation holds them (read at a claim or an adoption)."""
        with self._lock:
            self._conditions[key] = list(conditions)

    def set_conditions(self, key: str, *new: Obj) -> list[Obj]:
        """Its conditions with ``new`` replacing those of the same type (a transition time
        is kept while a condition's status does not change)."""
        with self._lock:
            current = {c.get("type"): c for c in self._conditions.get(key, [])}
            for c in new:
                old = current.get(c["type"])
                if old is not None and old.get("status") == c["status"]:
                    c = {**c, "lastTransitionTime": old.get("lastTransitionTime", c[
                        "lastTransitionTime"])}  # fmt: skip
                current[c["type"]] = c
            self._conditions[key] = list(current.values())
            return list(self._conditions[key])

    # -- writes --------------------------------------------------------------------------------

    def patch(self, key: str, fields: Obj, conditions: Iterable[Obj] = ()) -> None:
        """Merge-patch the status (with ``conditions`` set, if any): now if it is `URGENT`
        (with what waits for it) or due (nothing written for ``interval_s``), else kept for
        `flush`; kept too if the apiserver does not answer (a deleted Simulation's patches
        are dropped)."""
        status = dict(fields)
        new = tuple(conditions)
        if new:
            status["conditions"] = self.set_conditions(key, *new)
        urgent = any(k in status for k in URGENT)
        with self._lock:
            waiting = key in self._waiting
            if waiting or not (urgent or self._due(key)):
                self._waiting[key] = {**self._waiting.get(key, {}), **status}
                if not urgent:
                    return  # keep the order: older changes go first, merged
                status = self._waiting.pop(key)
        self._write(key, status)

    def _due(self, key: str) -> bool:
        last = self._written.get(key)
        return last is None or self.clock() - last >= self.interval_s

    def _write(self, key: str, status: Obj) -> bool:
        """One patch; False (and kept) if the apiserver did not answer."""
        try:
            self.api.patch_status(key, status)
        except NotFound:
            return True  # deleted by its user
        except ApiError as exc:
            self.api_error = first_line(exc)
            with self._lock:
                self._waiting[key] = {**status, **self._waiting.get(key, {})}
            return False
        self.api_error = None
        self._written[key] = self.clock()
        return True

    def flush(self) -> bool:
        """Write the patches kept while the apiserver did not answer, and those coalesced
        that are due (`URGENT`, or ``interval_s`` after the last write); False if the
        apiserver did not answer."""
        with self._lock:
            keys = list(self._waiting)
        for key in keys:
            with self._lock:
                status = self._waiting.get(key)
            if status is None or not (any(k in status for k in URGENT) or self._due(key)):
                continue
            try:
                self.api.patch_status(key, status)
            except NotFound:
                pass  # deleted by its user: its patch is dropped
            except ApiError as exc:
                self.api_error = first_line(exc)
                return False
            self._written[key] = self.clock()
            self._sent(key, status)
        self.api_error = None
        return True

    def _sent(self, key: str, status: Obj) -> None:
        """``status`` was written: keep only what was patched meanwhile and is newer."""
        with self._lock:
            if self._waiting.get(key) is status:
                del self._waiting[key]
            elif key in self._waiting:
                newer = self._waiting[key]
                self._waiting[key] = {k: v for k, v in newer.items()
                                      if status.get(k, object()) != v}  # fmt: skip
                if not self._waiting[key]:
                    del self._waiting[key]

    # -- what waits ----------------------------------------------------------------------------

    def waiting(self) -> set[str]:
        """The keys of the Simulations with a patch not written yet."""
        with self._lock:
            return set(self._waiting)

    def unwritten(self, key: str) -> Obj | None:
        """What waits to be written into its status (None: nothing)."""
        with self._lock:
            found = self._waiting.get(key)
            return None if found is None else dict(found)

    def superseded(self, key: str) -> None:
        """Its whole status is being replaced (a claim): what waits for it is stale."""
        with self._lock:
            self._waiting.pop(key, None)

    def wrote(self, key: str) -> None:
        """Its status was just written otherwise (a claim replaced it)."""
        self._written[key] = self.clock()

    def forget(self, key: str) -> None:
        """Its Simulation is gone: nothing of it is written any more."""
        with self._lock:
            self._waiting.pop(key, None)
            self._conditions.pop(key, None)

    def keep_final_phases(self) -> None:
        """Forget what is not written but a final phase (this operator stopped leading:
        another leader may act on the Simulations now; a late Queued or progress patch would
        undo its work, an end it recorded would not)."""
        with self._lock:
            self._waiting = {
                key: st for key, st in self._waiting.items()
                if st.get("phase") in ("Succeeded", "Failed")
            }  # fmt: skip
