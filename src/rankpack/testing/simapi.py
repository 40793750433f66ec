"""A cost model of the Kubernetes apiserver for the simulated cluster (issue 29).

The simulated backend makes no requests; with an `ApiModel` the cluster counts the ones
the Kubernetes backend would make for each of its calls, and delays what a write does by
the apiserver's latency and its requests-per-second limit (a token bucket on the virtual
clock, shared by every backend on the cluster, as the apiserver is shared):

* ``launch``: one create per rank pod, plus the owner ConfigMap and the headless Service;
  the simulation's ranks start ``SimTiming.start_s`` after the last create is done;
* ``resize``: one patch of ``pods/resize``; the node sees it once the patch is done;
* ``release`` (which stops a simulation still running): deletes of its pods, ConfigMap and
  Service (``DELETE_REQUESTS``: a delete collection for the pods);
* reads: with ``reads="watch"`` (informers: a watch cache, `rankpack.backend.kubernetes`
  after issue 29) ``observe`` and ``inventory`` cost nothing; with ``reads="poll"`` (the
  backend before it) ``observe`` lists the simulation's pods and ``inventory`` lists the
  nodes and every pod of the cluster: they take their turn in the bucket too, so polling
  delays the writes behind it. A read's latency is not charged to virtual time (the loop
  does not advance the clock between its calls).

Staging and wait-mode switches make no request (the case's copy and the shim's control
word are written on the volume or through the node agents, not through the apiserver).
Status writes of the operator are not the backend's and are not counted here.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

DELETE_REQUESTS = 3
"""A simulation's teardown: delete collection of its pods, its ConfigMap, its Service."""
OBJECTS_PER_LAUNCH = 2
"""Created beside the rank pods: the owner ConfigMap and the headless Service."""


@dataclass
class ApiModel:
    """The apiserver as the simulated cluster's backends would load it (see module doc)."""

    latency_s: float = 0.005
    """Time from sending a request to its answer, virtual seconds."""
    rps: float | None = 100.0
    """Requests per second the apiserver serves this client (None: no limit)."""
    reads: Literal["watch", "poll"] = "watch"
    """``watch``: observations and inventories come from a cache; ``poll``: each is a LIST."""
    requests: Counter[str] = field(default_factory=Counter)
    """Requests made so far, by verb (create, patch, delete, list)."""
    _free_at: float = 0.0

    def write(self, now: float, verb: str, n: int = 1) -> float:
        """``n`` requests sent at ``now``; when the last of them is done."""
        return self._take(now, verb, n) + self.latency_s

    def read(self, now: float, verb: str, n: int = 1) -> None:
        """``n`` reads (only when polling: a watch cache answers without a request)."""
        if self.reads == "poll":
            self._take(now, verb, n)

    def counts(self) -> dict[str, int]:
        return dict(self.requests)

    def _take(self, now: float, verb: str, n: int) -> float:
        """Serve ``n`` requests through the bucket; when the last one starts."""
        self.requests[verb] += n
        if self.rps is None or not math.isfinite(self.rps) or self.rps <= 0:
            return now
        start = max(now, self._free_at)
        self._free_at = start + n / self.rps
        return start + (n - 1) / self.rps
