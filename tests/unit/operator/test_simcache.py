"""The operator's reads of Simulations, cheap (issue 29): read from a cache of watches
(`SimulationCache`, one per namespace); a broken watch is a listing that fails for the queue;
the apiserver requests exposed to Prometheus. (Status writes coalesced: test_outbox.)"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rankpack.backend.kubernetes.api.informer import Cache
from rankpack.backend.kubernetes.api.kubeapi import ApiError, RequestCounter
from rankpack.operator import crd, queue
from rankpack.operator.simcache import SimulationCache, collection
from rankpack.plan.submission import Submission

from .fakes import FakeSims

Obj = dict[str, Any]


def simulation(name: str, ns: str, rv: int, phase: str | None = None) -> Obj:
    obj = crd.simulation(name, Submission(case="pitzDaily", weights=(1, 1), budget_millis=2000))
    obj["metadata"].update(namespace=ns, uid=f"uid-{name}", resourceVersion=str(rv),
                           creationTimestamp=f"2026-01-01T00:00:0{rv % 10}Z")  # fmt: skip
    if phase:
        obj["status"] = {"phase": phase}
    return obj


class Watches:
    """Lists and watches of Simulations (the `KubeApi` calls a cache makes): per path, a
    List and the events each following watch yields."""

    def __init__(self) -> None:
        self.requests = RequestCounter()
        self.lists: dict[str, list[Obj]] = {}
        self.events: dict[str, list[list[Obj]]] = {}
        self.down = False
        self.paths: list[str] = []

    def list_collection(self, path: str, query: Mapping[str, str] | None = None) -> Obj:
        self.paths.append(path)
        return {"items": copy.deepcopy(self.lists.get(path, [])),
                "metadata": {"resourceVersion": "10"}}  # fmt: skip

    def watch(
        self, path: str, *, query: Mapping[str, str] | None = None, timeout_s: float = 60.0
    ) -> Iterator[Obj]:
        if self.down:
            raise ApiError(0, "Unreachable", "connection refused")
        batches = self.events.get(path) or [[]]
        return iter(batches.pop(0) if batches else [])


def test_a_set_of_namespaces_is_one_watch_each_and_one_list(tmp_path: Path) -> None:
    api = Watches()
    a, b = collection("team-a").path, collection("team-b").path
    api.lists = {a: [simulation("x", "team-a", 5)], b: [simulation("y", "team-b", 6, "Queued")]}
    sims = SimulationCache(Cache(api, background=False), ["team-b", "team-a"])  # type: ignore[arg-type]
    woken: list[int] = []
    sims.on_change(lambda: woken.append(1))
    sims.start()
    assert sorted(api.paths) == [a, b]
    assert a == f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/team-a/{crd.PLURAL}"
    assert sorted(o["metadata"]["name"] for o in sims.list()) == ["x", "y"]
    api.events[a] = [[{"type": "MODIFIED", "object": simulation("x", "team-a", 11, "Queued")}]]
    assert {o["metadata"]["name"]: o.get("status", {}).get("phase") for o in sims.list()} == {
        "x": "Queued", "y": "Queued",
    }  # fmt: skip
    assert woken  # a change wakes the loop
    assert len(api.paths) == 2  # listed once each: reads are rounds of their watches
    every = SimulationCache(Cache(api, background=False), None)  # type: ignore[arg-type]
    assert every.collections == [collection(None)]
    assert collection(None).path == f"/apis/{crd.GROUP}/{crd.VERSION}/{crd.PLURAL}"


def test_a_broken_watch_is_a_list_that_fails_for_the_queue(tmp_path: Path) -> None:
    api = Watches()
    path = collection("ns").path
    api.lists = {path: [simulation("a", "ns", 5)]}
    cache = SimulationCache(Cache(api, background=False), ["ns"])  # type: ignore[arg-type]
    cache.start()
    sims = FakeSims()
    sims.cache = cache  # type: ignore[attr-defined]
    sims.list = cache.list  # type: ignore[method-assign]  # (FakeSims stands for SimulationApi)
    q = queue.SimulationQueue(sims, "op-1")  # type: ignore[arg-type]
    sims.objs["a"] = simulation("a", "ns", 5)
    assert [q.index.names[j.queue_id] for j in q.pending()] == ["a"]
    api.down = True  # the apiserver went away: the next watch cannot be opened
    assert q.pending() == [] and not q.idle() and q.api_error
    api.down = False
    assert len(q.pending()) == 1


def test_the_operators_own_write_is_read_back_before_its_watch_event() -> None:
    api = Watches()
    path = collection("ns").path
    api.lists = {path: [simulation("a", "ns", 5, "Queued")]}
    sims = SimulationCache(Cache(api, background=False), ["ns"])  # type: ignore[arg-type]
    sims.start()
    sims.saw(simulation("a", "ns", 12, "Running"))  # a claim's answer
    api.events[path] = [[{"type": "MODIFIED", "object": simulation("a", "ns", 11, "Queued")}]]
    (obj,) = sims.list()
    assert obj["status"]["phase"] == "Running"  # the older event does not undo it
    sims.saw(simulation("a", "ns", 9, "Queued"))  # an older answer changes nothing
    assert sims.list()[0]["status"]["phase"] == "Running"


def test_the_operators_requests_are_exposed_to_prometheus() -> None:
    from prometheus_client import generate_latest

    from rankpack.operator.metrics import OperatorMetrics

    counter = RequestCounter()
    counter.add("watch", "simulations")
    counter.add("patch", "simulations/status", 200, 4)
    text = generate_latest(OperatorMetrics(counter).registry).decode()
    assert (
        'rankpack_apiserver_requests_total{code="200",resource="simulations/status",'
        'verb="patch"} 4.0'
    ) in text
