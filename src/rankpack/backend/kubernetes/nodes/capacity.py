"""What the cluster can hold for the Kubernetes backend: its nodes, their use, the quota.

`ClusterCapacity.inventory` answers `KubernetesBackend.inventory`: ready, schedulable nodes with
the requests of every live pod (all namespaces if the identity may list them, else this
namespace and the node agents'), what schedulable nodes that are not Ready could allocate
once back, the namespace's tightest CPU quotas (``requests.cpu``, ``limits.cpu``) and what
its LimitRanges allow a rank's request (`limits`). All of it is read from the backend's
cache (`informer`: listed once, then watched), so the control loop's inventory every tick
costs the apiserver nothing. `ClusterCapacity.launch_check` checks a launch against the quotas and
LimitRanges the cache holds, before anything is created. Refusals (403) are learned and
remembered; while the apiserver does not answer, the cache answers what it last saw (and
before it was ever listed, the last inventory read).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.informer import Cache, core
from rankpack.backend.kubernetes.api.kubeapi import ApiError, KubeApi, Obj
from rankpack.backend.kubernetes.objects import launcherpods, limits, status
from rankpack.backend.kubernetes.objects.grouppods import pod_ranks
from rankpack.backend.protocol import BackendError, Inventory, NodeCapacity, Quota, RankResources
from rankpack.core.failures import FailureCode


class LaunchCheck(NamedTuple):
    refusal: tuple[FailureCode, str] | None
    """Why the namespace would refuse the launch (None: it would not)."""
    launcher_millis: int
    """The launcher pod's CPU request within the namespace's LimitRange (pod mode)."""


class ClusterCapacity:
    LIVE = "status.phase!=Succeeded,status.phase!=Failed"
    """Pods that hold their CPU request (a field selector: a pod that ends leaves the watch
    as DELETED)."""

    def __init__(
        self,
        api: KubeApi,
        config: KubernetesConfig,
        cache: Cache,
        node_requests: Callable[[Sequence[str]], Mapping[str, int]] | None = None,
    ) -> None:
        self.api, self.config, self.cache = api, config, cache
        self.node_requests = node_requests
        """What every pod of each node requests, as the node agents count them (None: no
        agents): a node's use is the larger of that and what this identity sees."""
        self._nodes_forbidden = False
        self._agents_forbidden = False
        self._forbidden: set[str] = set()
        """Namespaced kinds this identity may not list (learned from a 403, not asked again)."""
        self._inventory: Inventory | None = None
        """The last inventory read: answered while the apiserver does not answer."""

    def inventory(self) -> Inventory:
        """Ready, schedulable nodes: allocatable minus the requests of every pod that is not
        terminated (all namespaces if the identity may list them, else this namespace).

        While the apiserver does not answer (unreachable, 5xx), the last inventory read is
        answered: nothing can be launched then anyway (creating pods fails and is retried),
        and the control loop must not stop over it."""
        try:
            found = self._read_inventory()
        except ApiError as exc:
            if exc.transient and self._inventory is not None:
                return self._inventory
            raise
        except BackendError as exc:
            cause = exc.__cause__
            if isinstance(cause, ApiError) and cause.transient and self._inventory is not None:
                return self._inventory
            raise
        self._inventory = found
        return found

    def _namespaced(self, kind: str, *, fresh: bool = False) -> list[Obj]:
        """The namespace's ``kind`` objects, from the cache (``fresh``: listed now); [] if
        this identity may not list them."""
        if kind in self._forbidden:
            return []
        if not fresh:
            cached = self.cache.informer(core(kind, self.api.namespace))
            if not cached.forbidden:
                return cached.items()
            self._forbidden.add(kind)
            return []
        try:
            return self.api.list(kind, "")
        except ApiError as exc:
            if exc.status != 403:
                raise
            self._forbidden.add(kind)  # no right to read them: learned from refusals
            return []

    def quotas(self, *, fresh: bool = False) -> list[Quota]:
        """Every CPU entry of the namespace's ResourceQuotas that counts rank pods."""
        found = self._namespaced("resourcequotas", fresh=fresh)
        return [q for quota in found for q in limits.cpu_quotas(quota)]

    def limit_ranges(self, *, fresh: bool = False) -> list[Obj]:
        return self._namespaced("limitranges", fresh=fresh)

    def launch_check(self, pods: Sequence[tuple[str, RankResources]]) -> LaunchCheck:
        """Why the namespace would refuse these pods (what each is called in a refusal, its
        container's CPU: a simulation's group pods) (and, in pod mode, the launcher
        pod, its request brought within the LimitRange), as the cache holds the quotas and
        LimitRanges now (watched: as fresh as a List; `limits.launch_refusal`);
        no refusal when they fit (or the apiserver does not answer: the creates will tell)."""
        launcher = self.config.launcher_cpu_millis
        try:
            quotas, ranges = self.quotas(), self.limit_ranges()
        except ApiError as exc:
            if exc.transient:
                return LaunchCheck(None, launcher)
            raise
        pods = list(pods)
        if self.config.launcher == "pod":
            bounds = limits.rank_bounds(ranges)
            if bounds is not None and not bounds.empty:
                launcher = bounds.clamp(launcher)
            pods += [(f"the launcher pod's {c} container", RankResources(launcher))
                     for c in launcherpods.CONTAINERS]  # fmt: skip
        return LaunchCheck(limits.launch_refusal(pods, quotas, ranges), launcher)

    def _read_inventory(self) -> Inventory:
        overhead = (
            self.config.launcher_cpu_millis * len(launcherpods.CONTAINERS)
            if self.config.launcher == "pod"
            else 0
        )
        quotas = self.quotas()
        return replace(
            self._read_nodes(),
            quota=limits.tightest(quotas, "requests.cpu"),
            limits_quota=limits.tightest(quotas, "limits.cpu"),
            rank_bounds=limits.rank_bounds(self.limit_ranges()),
            launch_overhead_millis=overhead,
        )

    def _here(self) -> list[Obj]:
        """This namespace's pods, as the backend's cache holds them."""
        return self.cache.informer(core("pods", self.api.namespace)).items()

    def _visible_pods(self) -> list[Obj]:
        """Every live pod when the identity may list them all; else this namespace's, the
        other namespaces the operator serves (`KubernetesConfig.counted_namespaces`) and the
        node agents' (what the operator may read: the agents request CPU on every node too,
        and a plan that ignored them would not fit)."""
        everywhere = self.cache.informer(core("pods", fields=self.LIVE))
        if not everywhere.forbidden:
            return everywhere.items()
        pods = [p for p in self._here() if _live(p)]
        for other in self.config.counted_namespaces:  # the operator's other namespaces
            if other == self.api.namespace:
                continue
            theirs = self.cache.informer(core("pods", other))
            if not theirs.forbidden:  # (no right to read them: the cache learned it once)
                pods += [p for p in theirs.items() if _live(p)]
        agents = self.config.agent_namespace
        if agents and agents != self.api.namespace and not self._agents_forbidden:
            theirs = self.cache.informer(core("pods", agents))
            self._agents_forbidden = theirs.forbidden
            pods += [p for p in theirs.items() if _live(p)]
        return pods

    def _read_nodes(self) -> Inventory:
        try:
            cached = None if self._nodes_forbidden else self.cache.informer(core("nodes"))
            if cached is None or cached.forbidden:
                raise ApiError(403, "Forbidden", "nodes is forbidden (remembered)")
            schedulable = [
                n for n in cached.items() if not n.get("spec", {}).get("unschedulable")
            ]  # fmt: skip
            schedulable.sort(key=lambda n: str(n.get("metadata", {}).get("name")))
            nodes = [n for n in schedulable if status.node_ready(n)]
            unready = sum(
                status.node_allocatable_millis(n) for n in schedulable if not status.node_ready(n)
            )
        except ApiError as exc:
            self._nodes_forbidden = exc.status == 403
            if exc.status != 403 or self.config.allocatable_millis is None:
                raise BackendError(
                    f"cannot read the cluster's nodes ({exc}); give the CPU the namespace may "
                    "use with --allocatable (e.g. --allocatable 2 on the dev cluster), or "
                    "grant this identity get/list on nodes"
                ) from exc
            total = sum(status.pod_request_millis(p) for p in self._here() if _live(p))
            return Inventory((NodeCapacity("cluster", self.config.allocatable_millis, total),))
        pods = self._visible_pods()
        used: dict[str, int] = {}
        ranks: dict[str, int] = {}
        for p in pods:
            node = p.get("spec", {}).get("nodeName")
            if node:
                used[node] = used.get(node, 0) + status.pod_request_millis(p)
                ranks[node] = ranks.get(node, 0) + len(pod_ranks(p))
        names = [str(n["metadata"]["name"]) for n in nodes]
        if self.node_requests is not None:  # pods this identity cannot see count too
            for name, millis in self.node_requests(names).items():
                used[name] = max(used.get(name, 0), millis)
        return Inventory(
            tuple(
                NodeCapacity(
                    name,
                    status.node_allocatable_millis(n),
                    used.get(name, 0),
                    ranks.get(name, 0),
                    rank_groups=True,
                )
                for name, n in zip(names, nodes, strict=True)
            ),
            unready_millis=unready,
        )


def _live(pod: Obj) -> bool:
    return pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")
