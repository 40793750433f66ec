"""Which Simulation is which job, run and simulation: `SimulationIndex`.

The control loop knows a Simulation by a queue id, the store by a run id, the backend by a
sim id, its Events by its uid; the operator by its key (``namespace/name``,
`rankpack.operator.simapi.simulation_key`). The index holds those maps for the queue
(`rankpack.operator.queue`), its adoption (`rankpack.operator.adoption`) and the readers
that name a Simulation: its status writer, its Events, metrics and timeline
(`rankpack.operator.display`, `rankpack.operator.service`). Queue ids are stable in this
process.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from rankpack.store import EventRow


class SimulationIndex:
    """The queue's maps of ids and keys (see the module doc)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        """Simulation key -> the queue id the loop knows it by."""
        self.names: dict[int, str] = {}
        """Queue id -> Simulation key."""
        self.run_ids: dict[int, int] = {}
        """Queue id -> the run it launched (the store's run id)."""
        self.sim_names: dict[str, str] = {}
        """The backend's sim id -> Simulation key."""
        self.uids: dict[str, str] = {}
        """Simulation key -> metadata.uid (what its Events refer to)."""
        self.holding: dict[int, str] = {}
        """Queue id -> uid of the Simulations this process claimed or adopted and has not
        finished: what `withdrawn` looks for in each listing."""
        self.gone: set[int] = set()
        """Withdrawn jobs: their end is written nowhere (their Simulation is gone)."""
        self._next_id = 1
        self._lock = threading.Lock()

    def queue_id(self, key: str) -> int:
        """Its queue id (a new one the first time it is asked)."""
        with self._lock:
            if key not in self.ids:
                self.ids[key] = self._next_id
                self.names[self._next_id] = key
                self._next_id += 1
            return self.ids[key]

    def key(self, queue_id: int) -> str | None:
        return self.names.get(queue_id)

    def hold(self, queue_id: int, uid: str) -> None:
        """This process claimed or adopted it (``uid``: its Simulation's)."""
        self.holding[queue_id] = uid

    def release(self, queue_id: int) -> None:
        """Its run ended: this process no longer holds it."""
        self.holding.pop(queue_id, None)

    def launched(self, queue_id: int, run_id: int | None, sim_id: str) -> None:
        """It runs as ``sim_id``, recorded as run ``run_id`` (None: not known)."""
        if run_id is not None:
            self.run_ids[queue_id] = run_id
        key = self.names.get(queue_id)
        if key is not None:
            self.sim_names[sim_id] = key

    def unlaunched(self, queue_id: int) -> None:
        """Back in the queue: its launch (run, sim id) is forgotten and this loop no longer
        holds it."""
        self.run_ids.pop(queue_id, None)
        self.holding.pop(queue_id, None)
        key = self.names.get(queue_id)
        self.sim_names = {k: v for k, v in self.sim_names.items() if v != key}

    def forget(self, queue_id: int) -> str | None:
        """A withdrawn job: all of it is forgotten (a Simulation made again under its name is
        a new job); its key, or None if it was not known."""
        key = self.names.pop(queue_id, None)
        if key is None:
            return None
        self.ids.pop(key, None)
        self.gone.discard(queue_id)
        self.holding.pop(queue_id, None)
        self.run_ids.pop(queue_id, None)
        self.sim_names = {k: v for k, v in self.sim_names.items() if v != key}
        return key

    def withdrawn(self, listed: Mapping[str, str]) -> set[int]:
        """The jobs this process holds whose Simulation is gone from ``listed`` (key -> uid
        of a listing), or was made again under the same name (another uid); remembered as
        gone."""
        gone = set()
        for qid, uid in list(self.holding.items()):
            key = self.names.get(qid)
            if key is not None and (key not in listed or (uid and listed[key] != uid)):
                gone.add(qid)
        self.gone |= gone
        return gone

    def key_of_event(self, e: EventRow) -> str | None:
        """The Simulation a store event is about: by its queue id, its run or its sim id."""
        qid = e.detail.get("queue_id")
        if isinstance(qid, int) and qid in self.names:
            return self.names[qid]
        if e.run_id is not None:
            for q, rid in list(self.run_ids.items()):
                if rid == e.run_id:
                    return self.names.get(q)
        sim = e.detail.get("sim")
        return self.sim_names.get(sim) if isinstance(sim, str) else None

    def run_keys(self) -> dict[int, str]:
        """Run id -> Simulation key, of the runs this process launched or adopted."""
        return {run: self.names[qid] for qid, run in self.run_ids.items() if qid in self.names}
