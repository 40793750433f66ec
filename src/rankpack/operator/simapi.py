"""The Simulation custom resource's client: `SimulationApi`, and how a Simulation is named.

The Simulations of the served namespaces (and the core/v1 Events on them) through the
project's REST boundary (`ClientKubeApi.request`): plain JSON in and out, typed errors
(`NotFound`, `Conflict`, `ApiError`). Used by the operator's queue (`queue`, its listing
`listing` and its status outbox `outbox`), by `service`, and by `rankpack submit|simulations|
events --backend kubernetes` (`rankpack.cli.operator_cmd`).

Serving several namespaces (`rankpack.operator.tenancy`), a Simulation is known by its key,
``namespace/name`` (client-go's cache key; one namespace: its name alone, `simulation_key`).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rankpack.backend.kubernetes.api.client import ClientKubeApi
from rankpack.operator import crd

if TYPE_CHECKING:
    from rankpack.operator.simcache import SimulationCache

Obj = dict[str, Any]


class SimulationApi:
    """The Simulations of the served namespaces (and the Events on them), through the
    project's REST boundary (`ClientKubeApi.request`): plain JSON, typed errors
    (`NotFound`, `Conflict`, `ApiError`). One list per namespace (the operator holds no
    cluster-wide right); a Simulation is named by its key (`simulation_key`)."""

    def __init__(self, api: ClientKubeApi, namespace: str | Sequence[str]) -> None:
        self.api = api
        self.namespaces = (namespace,) if isinstance(namespace, str) else tuple(namespace)
        self.namespace = self.namespaces[0]
        """The first served namespace (a key without one names a Simulation there)."""
        self.cache: SimulationCache | None = None
        """Where `list` reads them (listed once, then watched); None: a List per call."""

    def path_in(self, namespace: str) -> str:
        return f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{namespace}/{crd.PLURAL}"

    @property
    def path(self) -> str:
        """The first namespace's Simulations collection."""
        return self.path_in(self.namespace)

    def _at(self, key: str) -> str:
        ns, _, name = key.rpartition("/")
        return f"{self.path_in(ns or self.namespace)}/{name}"

    def list(self) -> list[Obj]:
        """Every served namespace's Simulations; an error in any is the listing's (a
        namespace that does not answer must not look empty)."""
        if self.cache is not None:
            return self.cache.list()
        items: list[Obj] = []
        for ns in self.namespaces:
            items += self.api.request("GET", self.path_in(ns)).get("items", [])
        return items

    def _saw(self, obj: Obj) -> Obj:
        if self.cache is not None:
            self.cache.saw(obj)
        return obj

    def get(self, key: str) -> Obj:
        return self.api.request("GET", self._at(key))

    def watch(self, timeout_s: float, namespace: str | None = None) -> Iterator[Obj]:
        """The changes of a namespace's Simulations (default: the first) until the apiserver
        ends the watch."""
        return self.api.watch(self.path_in(namespace or self.namespace), timeout_s=timeout_s)

    def create(self, body: Obj) -> Obj:
        ns = str((body.get("metadata") or {}).get("namespace") or self.namespace)
        return self.api.request("POST", self.path_in(ns), body=body)

    def replace_status(self, obj: Obj) -> Obj:
        """Replace the status under the object's resourceVersion (`Conflict` if it
        changed)."""
        meta = obj["metadata"]
        key = f"{meta.get('namespace') or self.namespace}/{meta['name']}"
        return self._saw(self.api.request("PUT", f"{self._at(key)}/status", body=obj))

    def events(self, name: str | None = None) -> builtins.list[Obj]:
        """The core/v1 Events on Simulations (on ``name`` only, if given), oldest first."""
        selector = f"involvedObject.kind={crd.KIND}"
        if name:
            selector += f",involvedObject.name={name}"
        found = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/events",
                                 query={"fieldSelector": selector})  # fmt: skip
        return sorted(found.get("items", []), key=event_order)

    def patch_status(self, key: str, status: Obj) -> Obj:
        return self._saw(self.api.request(
            "PATCH", f"{self._at(key)}/status", body={"status": status},
            content_type="application/merge-patch+json",
        ))  # fmt: skip


def simulation_key(obj: Obj, several: bool) -> str:
    """A Simulation's key: ``namespace/name`` when several namespaces are served (client-go's
    cache key), else its name (a name holds no '/', so a key is never ambiguous)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name"))
    return f"{meta.get('namespace')}/{name}" if several and meta.get("namespace") else name


def event_order(e: Obj) -> tuple[str, int]:
    """Oldest first; in the same second, in the order the operator recorded them."""
    when = e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp")
    seq = str((e["metadata"].get("annotations") or {}).get(crd.EVENT_SEQUENCE, ""))
    return str(when or ""), int(seq) if seq.isdigit() else 0


def first_line(exc: BaseException) -> str:
    """An apiserver error as one short line (what the operator keeps and says)."""
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]
