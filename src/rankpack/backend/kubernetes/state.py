"""What the parts of one `KubernetesBackend` share: `BackendState`.

The backend (the control loop's thread), its poller (`poller`), the launch path (`launch`),
adoption (`adoption`) and resizes (`resizing`) each hold the one `BackendState` of their
backend, not the backend: the API and its settings, the shared cache and the namespace's
pods in it, every simulation's `record.SimRecord` under one lock, the news `wait` wakes on,
and the Warning Events recorded on rank pods.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

from rankpack.backend.kubernetes.api import informer
from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import ApiError, KubeApi, Obj
from rankpack.backend.kubernetes.objects import builders
from rankpack.backend.kubernetes.objects.reconcile import PodsLeft
from rankpack.backend.kubernetes.record import SimRecord
from rankpack.backend.worker import News

log = logging.getLogger(__name__)


class BackendState:
    """The API, the settings, the cache, the records (under `lock`) and the news of one
    backend."""

    def __init__(
        self, api: KubeApi, config: KubernetesConfig, *, background: bool, news: News
    ) -> None:
        self.api = api
        self.config = config
        self.cache = informer.Cache(api, background=background)
        """The shared local cache of what the backend reads (`informer`)."""
        self.pods_collection = informer.core("pods", api.namespace)
        """The namespace's pods (rank and launcher pods among them), as the cache holds them."""
        self.sims: dict[str, SimRecord] = {}
        self.lock = threading.RLock()
        """Guards the records, which the control loop's thread and the poller's share."""
        self.news = news
        """What `wait` waits on (shared by the backends of several namespaces: `tenants`)."""
        self._events_refused: set[str] = set()
        """Reasons whose Event the apiserver refused (logged once each)."""

    def clock(self) -> float:
        return time.monotonic()

    def notify(self) -> None:
        """Wake the backend's `wait` now."""
        self.news.notify()

    def live(self) -> list[SimRecord]:
        """The records not released yet."""
        with self.lock:
            return [s for s in self.sims.values() if not s.life.released]

    def pods_left(self, sim_id: str) -> PodsLeft:
        """A simulation's pods in the cache, after waiting for a change (`reconcile.delete`)."""

        def left(wait_s: float) -> list[Obj]:
            found = self.cache.informer(self.pods_collection)
            if wait_s > 0:
                found.wait(found.version, wait_s)
            return [p for p in found.items()
                    if (p.get("metadata", {}).get("labels") or {}).get(builders.SIM_LABEL)
                    == sim_id]  # fmt: skip

        return left

    def record_event(self, sim: SimRecord, rank: int, reason: str, message: str) -> None:
        """Record a Warning Event on the rank pod; best effort (never fails the caller)."""
        pod = sim.pods.get(rank) or {}
        body = builders.event(
            sim.spec.sim_id, self.api.namespace, sim.pod_name(rank),
            pod.get("metadata", {}).get("uid"), reason, message,
            datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )  # fmt: skip
        try:
            self.api.create("events", body)
        except ApiError as exc:  # said in the log, once per reason (a refusal is not silent)
            if reason not in self._events_refused:
                self._events_refused.add(reason)
                log.warning("the %s Event on %s was refused: %s", reason,
                            body["involvedObject"]["name"], exc)  # fmt: skip
