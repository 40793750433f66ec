"""The operator's reads of Simulations, cheap (issue 29): read from a cache of watches
(`SimulationCache`, one per namespace); a broken watch is a listing that fails for the queue;
the apiserver requests exposed to Prometheus. (Status writes coalesced: test_outbox.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rankpack.backend.kubernetes.api.informer import Cache
from rankpack.backend.kubernetes.api.kubeapi import RequestCounter
from rankpack.operator import crd, queue
from rankpack.operator.simcache import SimulationCache, collection
from rankpack.plan.submission import Submission
from tests.fakeapi import FakeKubeApi, FakeSims

Obj = dict[str, Any]


def simulation(name: str, ns: str, rv: int, phase: str | None = None) -> Obj:
    obj = crd.simulation(name, Submission(case="pitzDaily", weights=(1, 1), budget_millis=2000))
    obj["metadata"].update(namespace=ns, uid=f"uid-{name}", resourceVersion=str(rv),
                           creationTimestamp=f"2026-01-01T00:00:0{rv % 10}Z")  # fmt: skip
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def listed(api: FakeKubeApi) -> list[str]:
    """The collections listed so far (a watch is no List)."""
    return sorted(path for method, path, _ in api.sent if method == "GET")


def test_a_set_of_namespaces_is_one_watch_each_and_one_list(tmp_path: Path) -> None:
    api = FakeKubeApi()
    a, b = collection("team-a").path, collection("team-b").path
    api.add_simulation("team-a", "x")
    api.add_simulation("team-b", "y", status={"phase": "Queued"})
    sims = SimulationCache(Cache(api, background=False), ["team-b", "team-a"])  # type: ignore[arg-type]
    woken: list[int] = []
    sims.on_change(lambda: woken.append(1))
    sims.start()
    assert listed(api) == [a, b]
    assert a == f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/team-a/{crd.PLURAL}"
    assert sorted(o["metadata"]["name"] for o in sims.list()) == ["x", "y"]
    api.simulations["team-a"]["x"]["status"] = {"phase": "Queued"}  # the next watch: MODIFIED
    assert {o["metadata"]["name"]: o.get("status", {}).get("phase") for o in sims.list()} == {
        "x": "Queued", "y": "Queued",
    }  # fmt: skip
    assert woken  # a change wakes the loop
    assert len(listed(api)) == 2  # listed once each: reads are rounds of their watches
    every = SimulationCache(Cache(api, background=False), None)  # type: ignore[arg-type]
    assert every.collections == [collection(None)]
    assert collection(None).path == f"/apis/{crd.GROUP}/{crd.VERSION}/{crd.PLURAL}"


def test_a_broken_watch_is_a_list_that_fails_for_the_queue(tmp_path: Path) -> None:
    sims = FakeSims()
    sims.add("a")
    cache = SimulationCache(Cache(sims.fake, background=False), ["ns"])  # type: ignore[arg-type]
    cache.start()
    sims.cache = cache  # the real SimulationApi reads its list from the cache
    q = queue.SimulationQueue(sims, "op-1")
    assert [q.index.names[j.queue_id] for j in q.pending()] == ["a"]
    sims.down = True  # the apiserver went away: the next watch cannot be opened
    assert q.pending() == [] and not q.idle() and q.api_error
    sims.down = False
    assert len(q.pending()) == 1


def test_the_operators_own_write_is_read_back_before_its_watch_event() -> None:
    api = FakeKubeApi()
    api.add_simulation("ns", "a", status={"phase": "Queued"})
    sims = SimulationCache(Cache(api, background=False), ["ns"])  # type: ignore[arg-type]
    sims.start()
    sims.saw(simulation("a", "ns", 12, "Running"))  # a claim's answer
    # a change made before the claim (its resourceVersion is older than 12) arrives now
    api.simulations["ns"]["a"]["status"]["message"] = "an older change"
    (obj,) = sims.list()
    assert int(obj["metadata"]["resourceVersion"]) == 12
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
