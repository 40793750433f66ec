"""One backend over several namespaces: the operator serving the Simulations of each.

`NamespacedBackends` is backend protocol v2 over one `KubernetesBackend` per namespace, so
that every object of a simulation (rank pods, launcher pod, Service, owner ConfigMap, their
Events) is created in the namespace of its Simulation, with the rights the admin granted
there, and nothing of the single-namespace backend changes. A simulation is routed by the
namespace its `StageSpec`/`SimSpec` names (the operator's job carries its Simulation's),
then by its sim id. All of them wake one `News`, so `wait` returns on news from any.

The inventory is the cluster's: the nodes, and the live pods of every served namespace
(`KubernetesConfig.counted_namespaces`) and the node agents'. A ResourceQuota binds only its
own namespace, so with several namespaces the policy plans with the nodes alone, and each
namespace's quotas are enforced where they apply: before any create of a launch in that
namespace (`LaunchRefused`: the Simulation waits ``Queued``, ``QuotaExceeded``) and by the
apiserver on every create and resize (a grow refused for quota is ``QuotaExceeded``, the
rank keeps its CPU). A rank's request is kept within every served namespace's LimitRange
(their intersection), so it fits whichever namespace it runs in.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Mapping
from dataclasses import replace

from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import ApiError, KubeApi
from rankpack.backend.kubernetes.backend import KubernetesBackend
from rankpack.backend.protocol import (
    BackendError,
    Inventory,
    RankBounds,
    RankResources,
    ResizeStatus,
    SimObservation,
    SimRef,
    SimSpec,
    StageSpec,
    UnknownSimulation,
)
from rankpack.backend.worker import News
from rankpack.core.actions import WaitMode


class NamespacedBackends:
    """Backend protocol v2 over one `KubernetesBackend` per served namespace (the first is
    the primary: the inventory and the facts are read through it)."""

    name = "kubernetes"

    def __init__(self, backends: Mapping[str, KubernetesBackend], news: News) -> None:
        if not backends:
            raise BackendError("no namespace to serve")
        self.backends = dict(backends)
        self.primary = next(iter(self.backends.values()))
        self._news = news
        self._where: dict[str, str] = {}
        """sim id -> the namespace it runs in."""
        self._bounds: dict[str, RankBounds | None] = {}
        """Each namespace's last LimitRange bounds read (answered while it does not answer)."""
        self._lock = threading.Lock()

    @property
    def namespaces(self) -> tuple[str, ...]:
        return tuple(self.backends)

    @property
    def config(self) -> KubernetesConfig:
        return self.primary.config

    @property
    def api(self) -> KubeApi:
        """The primary namespace's API (what is not a simulation's: nodes, the inventory)."""
        return self.primary.api

    def backend_of(self, namespace: str) -> KubernetesBackend:
        found = self.backends.get(namespace)
        if found is None:
            raise BackendError(
                f"namespace {namespace} is not served (serving {', '.join(self.backends)})"
            )
        return found

    def _of(self, sim_id: str) -> KubernetesBackend:
        with self._lock:
            ns = self._where.get(sim_id)
        if ns is None:
            raise UnknownSimulation(f"no simulation {sim_id} in this backend")
        return self.backends[ns]

    def _place(self, sim_id: str, namespace: str | None) -> KubernetesBackend:
        """The backend of ``namespace`` (None: where ``sim_id`` was staged, else the
        primary), remembered for ``sim_id``."""
        with self._lock:
            known = self._where.get(sim_id)
        ns = namespace or known or next(iter(self.backends))
        if known is not None and known != ns:
            raise BackendError(f"simulation {sim_id} runs in {known}, not in {ns}")
        backend = self.backend_of(ns)
        with self._lock:
            self._where[sim_id] = ns
        return backend

    # -- capacity and facts ------------------------------------------------------------------

    def inventory(self) -> Inventory:
        found = self.primary.inventory()
        if len(self.backends) == 1:
            return found
        bounds = [found.rank_bounds]
        for ns, backend in list(self.backends.items())[1:]:
            try:
                self._bounds[ns] = backend.rank_bounds()
            except ApiError as exc:
                if not exc.transient:
                    raise
            bounds.append(self._bounds.get(ns))
        # no one namespace's quota binds the others' simulations (see the module doc)
        return replace(found, quota=None, limits_quota=None, rank_bounds=intersect(bounds))

    def placement(self) -> dict[str, str]:
        return {**self.primary.placement(), "namespace": ",".join(self.backends)}

    def clock(self) -> float:
        return time.monotonic()

    # -- events ------------------------------------------------------------------------------

    def notify(self) -> None:
        self._news.notify()

    def wait(self, timeout_s: float) -> None:
        self._news.wait(timeout_s)

    # -- a simulation, in its namespace -------------------------------------------------------

    def stage(self, spec: StageSpec) -> None:
        self._place(spec.sim_id, spec.namespace).stage(spec)

    def launch(self, spec: SimSpec) -> None:
        self._place(spec.sim_id, spec.namespace).launch(spec)

    def adopt(self, sim_id: str, spec: SimSpec) -> None:
        self._place(sim_id, spec.namespace).adopt(sim_id, spec)

    def resize(self, sim_id: str, rank: int, resources: RankResources) -> ResizeStatus:
        return self._of(sim_id).resize(sim_id, rank, resources)

    def set_wait_mode(self, sim_id: str, mode: WaitMode) -> None:
        self._of(sim_id).set_wait_mode(sim_id, mode)

    def observe(self, sim_id: str) -> SimObservation:
        return self._of(sim_id).observe(sim_id)

    def stop(self, sim_id: str) -> None:
        self._of(sim_id).stop(sim_id)

    def release(self, sim_id: str) -> None:
        with self._lock:
            ns = self._where.get(sim_id)
        if ns is None:
            return  # never here, or released already: release is idempotent
        self.backends[ns].release(sim_id)
        with self._lock:
            self._where.pop(sim_id, None)

    def discard(self, sim_id: str) -> None:
        self._of(sim_id).discard(sim_id)

    def list(self) -> tuple[SimRef, ...]:
        """Every namespace's simulations (an error in any is the listing's: a namespace that
        does not answer must not look empty)."""
        refs: list[SimRef] = []
        for ns, backend in self.backends.items():
            found = backend.list()
            with self._lock:
                for ref in found:
                    self._where.setdefault(ref.sim_id, ns)
            refs += found
        return tuple(refs)

    def forget_all(self) -> builtins.list[str]:
        left = [sim for backend in self.backends.values() for sim in backend.forget_all()]
        with self._lock:
            self._where.clear()
        return left

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()


def intersect(bounds: list[RankBounds | None]) -> RankBounds | None:
    """The requests every one of ``bounds`` allows (None: each allows any). May be empty
    (a min above a max), which the policy treats as no bound."""
    found = [b for b in bounds if b is not None]
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    highs = [b.max_millis for b in found if b.max_millis is not None]
    defaults = [b.default_limit_millis for b in found if b.default_limit_millis is not None]
    return RankBounds(
        min_millis=max(b.min_millis for b in found),
        max_millis=min(highs) if highs else None,
        default_limit_millis=min(defaults) if defaults else None,
        source="; ".join(b.source for b in found if b.source),
    )
