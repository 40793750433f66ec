"""The shared cache (`informer`) over the real client, against the HTTP apiserver fake
(`tests.fakeapiserver`) replaying event sequences: what a List and each watch answered, byte
for byte as JSON lines (``data/*.json``). Nothing of the client is replaced: the boundary is
the HTTP stream.

Checked: ADDED/MODIFIED/DELETED/BOOKMARK taken in, each watch started from the last
resourceVersion with bookmarks asked for, ``410 Gone`` (as an ERROR event and as the watch's
status) lists again and only then, a broken watch resumes from where it was without a List,
the resourceVersion never goes back (stale events and bookmarks dropped), a refused watch
falls back to listing, a refused List is `forbidden`.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.api.client import ClientKubeApi
from rankpack.backend.kubernetes.api.config import load_config
from rankpack.backend.kubernetes.api.informer import REFUSALS, Cache, Informer, core
from tests.fakeapiserver import FakeApiserver

Obj = dict[str, Any]

pytestmark = pytest.mark.timeout(30)

DATA = Path(__file__).parent.parent / "data"
PODS = core("pods", "rankpack", labels="app.kubernetes.io/managed-by=rankpack")


def recorded(name: str) -> Any:
    return json.loads((DATA / name).read_text())


@pytest.fixture
def api(tmp_path: Path, server: FakeApiserver) -> ClientKubeApi:
    return ClientKubeApi(
        load_config(server.kubeconfig(tmp_path / "kubeconfig")), request_timeout_s=5
    )


def asked(server: FakeApiserver) -> list[tuple[str, dict[str, str]]]:
    """(path, query) of each request so far."""
    return [(s.path, s.query) for s in server.seen]


def names(inf: Informer) -> dict[str, str]:
    """name -> phase of the pods the cache holds."""
    return phases(inf.items())


def phases(pods: list[Obj]) -> dict[str, str]:
    return {p["metadata"]["name"]: p.get("status", {}).get("phase", "") for p in pods}


def fold(listed: Obj, events: list[Obj]) -> dict[str, str]:
    """What a List and the events after it say exists (name -> phase), worked out here."""
    held = {p["metadata"]["name"]: p for p in listed["items"]}
    for e in events:
        if e["type"] in ("ADDED", "MODIFIED"):
            held[e["object"]["metadata"]["name"]] = e["object"]
        elif e["type"] == "DELETED":
            held.pop(e["object"]["metadata"]["name"], None)
    return phases(list(held.values()))


def changes(events: list[Obj]) -> list[Obj]:
    return [e for e in events if e["type"] != "BOOKMARK"]


def name_of(event: Obj) -> str:
    return str(event["object"]["metadata"]["name"])


def test_a_pods_life_is_followed_from_the_list_and_one_watch(
    api: ClientKubeApi, server: FakeApiserver
) -> None:
    seq = recorded("pod_life.json")
    server.script.extend([("list", seq["list"]), ("watch", seq["watch"])])
    heard: list[tuple[str, str]] = []
    inf = Informer(api, PODS)
    inf.listeners.append(lambda kind, obj: heard.append((kind, obj["metadata"]["name"])))
    inf.list_now()
    assert names(inf) == phases(seq["list"]["items"])
    assert inf.resource_version == seq["list"]["metadata"]["resourceVersion"]
    inf.watch_once()
    assert names(inf) == fold(seq["list"], seq["watch"])
    born = [name_of(e) for e in seq["watch"] if e["type"] == "ADDED"]
    gone = [name_of(e) for e in seq["watch"] if e["type"] == "DELETED"]
    assert len(born) == 2 and len(gone) == 1 and gone[0] == born[1]  # one runs, one went
    assert names(inf)[born[0]] == "Running" and gone[0] not in names(inf)
    assert heard == [("ADDED", p["metadata"]["name"]) for p in seq["list"]["items"]] + [
        (e["type"], name_of(e)) for e in changes(seq["watch"])
    ]
    # the stream ends with a bookmark: where the next watch starts, nothing else changed
    assert seq["watch"][-1]["type"] == "BOOKMARK"
    assert inf.resource_version == seq["watch"][-1]["object"]["metadata"]["resourceVersion"]
    n_marks = len(seq["watch"]) - len(changes(seq["watch"]))
    assert (inf.stats.events, inf.stats.bookmarks, inf.stats.dropped) == (
        len(changes(seq["watch"])), n_marks, 0,
    )  # fmt: skip
    (_, listed), (path, watched) = asked(server)
    assert path == "/api/v1/namespaces/rankpack/pods"
    assert listed["labelSelector"] == watched["labelSelector"] == PODS.label_selector
    assert watched["watch"] == "true" and watched["allowWatchBookmarks"] == "true"
    assert watched["resourceVersion"] == seq["list"]["metadata"]["resourceVersion"]
    # the next watch starts from the bookmark: no List
    server.script.append(("watch", []))
    inf.pump()
    assert asked(server)[-1][1]["resourceVersion"] == inf.resource_version
    assert inf.stats.lists == 1 and inf.stats.watches == 2


def test_a_resize_completes_in_the_cache_when_the_watch_brings_it(
    api: ClientKubeApi, server: FakeApiserver
) -> None:
    seq = recorded("pod_resize.json")
    server.script.extend([("list", seq["list"]), ("watch", seq["watch"])])
    inf = Informer(api, PODS)
    inf.list_now()
    versions = [inf.version]
    inf.listeners.append(lambda kind, obj: versions.append(inf.version))
    inf.watch_once()
    (resized,) = {name_of(e) for e in changes(seq["watch"])}
    pod = inf.get(resized, "rankpack")
    assert pod is not None
    cs = pod["status"]["containerStatuses"][0]
    assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "700m"
    assert cs["resources"]["requests"]["cpu"] == "700m"  # the kubelet applied it
    conditions = pod["status"].get("conditions") or []
    assert not [c for c in conditions if c["type"].startswith("PodResize")]
    assert versions == sorted(versions) and len(versions) == 1 + len(changes(seq["watch"]))


def test_gone_as_an_error_event_lists_again_and_resumes_from_the_new_list(
    api: ClientKubeApi, server: FakeApiserver
) -> None:
    seq = recorded("pod_life.json")
    expired = {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
               "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
               "message": "too old resource version: 100 (2410)"}}  # fmt: skip
    gone = next(name_of(e) for e in seq["watch"] if e["type"] == "DELETED")
    upto = next(i for i, e in enumerate(seq["watch"]) if e["type"] == "ADDED"
                and name_of(e) == gone)  # fmt: skip
    later = seq["relist"]
    server.script.extend([("list", seq["list"]), ("watch", [*seq["watch"][: upto + 1], expired]),
                          ("list", later), ("watch", [])])  # fmt: skip
    heard: list[tuple[str, str]] = []
    inf = Informer(api, PODS)
    inf.listeners.append(lambda kind, obj: heard.append((kind, obj["metadata"]["name"])))
    inf.list_now()
    inf.pump()  # the watch ends with 410: listed again at once
    assert inf.stats.gone == 1 and inf.stats.lists == 2
    assert names(inf) == phases(later["items"])  # what the new List says
    assert gone not in names(inf) and ("DELETED", gone) in heard  # went while unwatched
    assert inf.resource_version == later["metadata"]["resourceVersion"]
    inf.pump()
    assert asked(server)[-1][1]["resourceVersion"] == later["metadata"]["resourceVersion"]
    assert [q.get("watch") for _, q in asked(server)] == [None, "true", None, "true"]


def test_gone_as_the_watchs_status_lists_again(api: ClientKubeApi, server: FakeApiserver) -> None:
    seq = recorded("pod_life.json")
    server.script.extend([
        ("list", seq["list"]),
        ("status", 410, {"reason": "Expired", "message": "too old resource version"}),
        ("list", seq["relist"]),
    ])  # fmt: skip
    inf = Informer(api, PODS)
    inf.list_now()
    inf.pump()
    assert (inf.stats.gone, inf.stats.lists) == (1, 2)
    assert inf.resource_version == seq["relist"]["metadata"]["resourceVersion"]


def test_a_broken_watch_resumes_from_its_resource_version_without_a_list(
    api: ClientKubeApi, server: FakeApiserver
) -> None:
    """The apiserver restarted mid-watch: the stream breaks off, the next one is refused;
    then it answers again and the watch goes on from the last resourceVersion seen."""
    seq = recorded("pod_life.json")
    first, rest = seq["watch"][:2], seq["watch"][2:]
    after = first[-1]["object"]["metadata"]["resourceVersion"]
    server.script.extend([
        ("list", seq["list"]), ("cut", first),
        ("status", 503, {"reason": "ServiceUnavailable", "message": "starting"}),
        ("watch", rest),
    ])  # fmt: skip
    inf = Informer(api, PODS)
    inf.list_now()
    stop = threading.Event()
    done = threading.Event()
    inf.listeners.append(lambda kind, obj: done.set() if kind == "DELETED" else None)
    thread = threading.Thread(target=inf.run, args=(stop,), daemon=True)
    thread.start()
    assert done.wait(20)
    stop.set()
    assert names(inf) == fold(seq["list"], [e for e in seq["watch"] if e["type"] != "BOOKMARK"])
    assert inf.stats.lists == 1 and inf.stats.gone == 0 and inf.stats.broken >= 2
    watches = [q for _, q in asked(server) if q.get("watch") == "true"]
    assert [q["resourceVersion"] for q in watches][:3] == [
        seq["list"]["metadata"]["resourceVersion"], after, after,
    ]  # fmt: skip


def test_the_resource_version_never_goes_back(api: ClientKubeApi, server: FakeApiserver) -> None:
    seq = recorded("pod_life.json")
    server.script.extend([("list", seq["list"]), ("watch", seq["watch"])])
    inf = Informer(api, PODS)
    inf.list_now()
    inf.watch_once()
    rv = inf.resource_version
    kept = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in inf.items()}
    old_pod = seq["watch"][1]["object"]  # an early version: older than the cache
    server.script.append(("watch", [
        {"type": "MODIFIED", "object": old_pod},
        {"type": "DELETED", "object": seq["list"]["items"][0] | {"metadata": {
            **seq["list"]["items"][0]["metadata"], "resourceVersion": "1"}}},
        {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                        "metadata": {"resourceVersion": "2"}}},
    ]))  # fmt: skip
    inf.watch_once()
    assert inf.resource_version == rv
    assert {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in inf.items()} == kept
    assert inf.stats.dropped == 2


def test_a_watch_refused_falls_back_to_listing_and_a_list_refused_is_forbidden(
    api: ClientKubeApi, server: FakeApiserver
) -> None:
    seq = recorded("pod_life.json")
    refused = ("status", 403, {"reason": "Forbidden", "message": "cannot watch pods"})
    server.script.extend([("list", seq["list"]), *[refused] * REFUSALS, ("list", seq["relist"])])
    inf = Informer(api, PODS)
    inf.list_now()
    for _ in range(REFUSALS):  # (a restarted apiserver refuses for a moment: backed off)
        inf.pump()
    assert inf.error and "Forbidden" in inf.error and not inf.forbidden
    inf.pump()  # refused that often in a row: from now on a List is the poll
    assert names(inf) == phases(seq["relist"]["items"])
    assert [q.get("watch") for _, q in asked(server)] == [None, *["true"] * REFUSALS, None]
    nodes = Cache(api, background=False)
    server.script.append(("status", 403, {"reason": "Forbidden", "message": "nodes"}))
    found = nodes.informer(core("nodes"))
    assert found.forbidden and found.items() == []


def test_a_shared_cache_lists_each_collection_once_for_every_reader(
    api: ClientKubeApi, server: FakeApiserver
) -> None:
    seq = recorded("pod_life.json")
    server.script.extend([("list", seq["list"]), ("watch", seq["watch"])])
    cache = Cache(api, background=False)
    a = cache.informer(PODS)
    b = cache.informer(PODS)  # a second reader: the same informer, one watch round
    assert a is b and a.stats.lists == 1 and a.stats.watches == 1
    assert api.requests.counts() == {("list", "pods", 200): 1, ("watch", "pods", 200): 1}
    stats = cache.stats()[str(PODS)]
    held = len(fold(seq["list"], seq["watch"]))
    assert (stats["lists"], stats["watches"], stats["objects"]) == (1, 1, held)
