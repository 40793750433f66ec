"""Lost nodes as the Kubernetes backend sees them: the cached nodes and their Leases.

`NodeWatch` reads the nodes and, where this identity may, the nodes' Leases
(``kube-node-lease``) from the backend's shared cache (`informer`: listed once, then
watched; the Leases only once a simulation runs) and applies the pure rules of
`nodehealth`. The poller (`poller`) asks `lost` each round and fails a simulation with a
rank pod or its launcher pod on a lost node, ``NodeLost``; `KubernetesBackend.observe`
asks `judge_end` before it reports a failed end (a node crash usually ends mpirun first);
`release` deletes the pods left on a lost node at once (`force_delete`: no kubelet will
ever confirm their end, so a graceful delete would wait for good).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from rankpack.backend.kubernetes.api.informer import Cache, Collection, core
from rankpack.backend.kubernetes.api.kubeapi import ApiError, KubeApi, Obj
from rankpack.backend.kubernetes.nodes import nodehealth
from rankpack.backend.kubernetes.objects import builders
from rankpack.backend.kubernetes.record import SimRecord
from rankpack.backend.mpirun import exit_failure
from rankpack.core.failures import Failure, FailureCode

LEASES = Collection(f"/apis/coordination.k8s.io/v1/namespaces/{nodehealth.LEASE_NAMESPACE}/leases")
"""The nodes' Leases (one per node, renewed by its kubelet every 10 s)."""

HELD_CODES = frozenset({FailureCode.SOLVER_FAILED, FailureCode.RANK_FAILED, FailureCode.OTHER})
"""The codes of an mpirun end that a lost node may be behind (a stop is never held)."""


class NodeWatch:
    """Which nodes are lost, from the backend's cache (see the module doc)."""

    def __init__(
        self,
        cache: Cache,
        rules: nodehealth.NodeHealthRules | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache = cache
        self.rules = rules or nodehealth.NodeHealthRules()
        self.clock = clock
        """Wall-clock time (the Leases' renewTime is one)."""
        self._nodes_forbidden = False
        self.fresh_since: float | None = None
        """When (wall clock) the nodes' and Leases' watches last came back after a break
        (None: unbroken since this process started); a Lease's silence counts from then at
        the earliest (`nodehealth`)."""
        self._broken = False

    def nodes(self) -> list[Obj] | None:
        """Every node as cached (None: this identity may not list them, or not listed yet)."""
        if self._nodes_forbidden:
            return None
        try:
            found = self.cache.informer(core("nodes"))
        except ApiError:
            return None
        if found.forbidden:
            self._nodes_forbidden = True
            return None
        return found.items()

    def leases(self) -> dict[str, Obj] | None:
        """The nodes' Leases by node name (None: they cannot be read)."""
        try:
            found = self.cache.informer(LEASES)
        except ApiError:
            return None
        if found.forbidden or not found.synced:
            return None
        return {str((lease.get("metadata") or {}).get("name")): lease for lease in found.items()}

    def fresh(self) -> bool:
        """Whether the cached nodes and Leases are fresh: their watches unbroken (the
        apiserver answers). Sets `fresh_since` when they come back after a break."""
        held = self.cache.informers()
        broken = any(
            (inf := held.get(c)) is not None and not inf.forbidden and inf.error is not None
            for c in (core("nodes"), LEASES)
        )
        if broken:
            self._broken = True
        elif self._broken:
            self._broken, self.fresh_since = False, self.clock()
        return not broken

    def lost(self) -> dict[str, str]:
        """The lost nodes by name, each with why (none when the nodes cannot be read, and
        none while the view of them is stale: the apiserver away)."""
        nodes = self.nodes()
        if nodes is None or not self.fresh():
            return {}
        return nodehealth.lost_nodes(
            nodes, self.leases(), self.clock(), self.rules, self.fresh_since
        )

    def judge_end(self, sim: SimRecord) -> str | None:
        """A simulation whose mpirun ended with a failure a lost node may be behind: ends it
        ``NodeLost`` if a node of its pods is lost; returns why it waits while that is not
        known yet (the caller reports it running); None once it is (or for any other end).
        Called under the backend's lock."""
        life = sim.life
        if not life.ended or life.failure is not None or life.released:
            return None
        failed = exit_failure(life.exit_code, stopped=life.stopped)
        if failed is None or failed.code not in HELD_CODES or sim.end_verdict is not None:
            return None
        now = self.clock()
        if sim.end_seen_s is None:
            sim.end_seen_s = now
        nodes = self.nodes()
        if nodes is None:
            sim.end_verdict = "alive"
            return None
        if not self.fresh():
            return f"mpirun ended ({failed.message}); waiting for the API to judge its nodes"
        verdict = nodehealth.failed_end_verdict(
            placed_nodes(sim), nodes, self.leases(), sim.end_seen_s, now, self.rules,
            self.fresh_since,
        )  # fmt: skip
        if verdict.state == "wait":
            return f"mpirun ended ({failed.message}); {verdict.why}"
        sim.end_verdict = verdict.state
        if verdict.state == "lost":
            life.lose_node(lost_failure(sim, verdict.why, failed.message))
        return None

    def force_delete(self, api: KubeApi, sim: SimRecord) -> int:
        """Delete at once (grace period 0) the simulation's pods on a lost node: their
        kubelet is gone and would never confirm a graceful end. Best effort; how many."""
        lost = self.lost()
        pods = [*sim.group_pods(), *([sim.launcher] if sim.launcher else [])]
        deleted = 0
        for pod in pods:
            if (pod.get("spec") or {}).get("nodeName") not in lost:
                continue
            with contextlib.suppress(ApiError):
                api.delete("pods", str(pod["metadata"]["name"]), grace_s=0)
                deleted += 1
        return deleted


def placed_nodes(sim: SimRecord) -> set[str]:
    """The nodes of a simulation's rank pods and launcher pod (as last listed)."""
    pods = [*sim.group_pods(), *([sim.launcher] if sim.launcher else [])]
    return {str(n) for p in pods if (n := (p.get("spec") or {}).get("nodeName"))}


def hit(sim: SimRecord, lost: dict[str, str]) -> tuple[int, str] | None:
    """The first of the simulation's pods on a lost node: (its rank, -1 for the launcher
    pod; why), or None."""
    for rank in sorted(sim.pods):
        node = (sim.pods[rank].get("spec") or {}).get("nodeName")
        if node in lost:
            name = sim.pod_name(rank)
            return rank, f"rank pod {name} is on a lost node: {lost[node]}"
    node = ((sim.launcher or {}).get("spec") or {}).get("nodeName")
    if node in lost:
        name = builders.launcher_pod_name(sim.spec.sim_id)
        return -1, f"launcher pod {name} is on a lost node: {lost[node]}"
    return None


def lost_failure(sim: SimRecord, why: str, ended: str = "") -> Failure:
    """The ``NodeLost`` failure of a simulation (``ended``: how its mpirun ended first)."""
    first = f"{why} (mpirun ended first: {ended})" if ended else why
    return Failure(FailureCode.NODE_LOST, first)
