"""Records the watch sequences `test_informer.py` replays, from the dev cluster (root, the
cluster up, nothing else in its namespace):
``python tests/unit/backend/kubernetes/data/record_watches.py``.

As the backend's ServiceAccount, through `ClientKubeApi` (the backend's own client): a List
of the namespace's pods labelled ``rankpack.dev/recorded``, then one watch from its
resourceVersion with bookmarks, kept as the apiserver sent it (each object's
``managedFields`` left out, to keep the files small), while:

- ``pod_life.json``: ``recorded-0`` runs before the List; ``recorded-1`` is created and runs;
  ``recorded-2`` is created and deleted; the watch is kept until the apiserver's bookmark;
  ``relist`` is a List taken afterwards;
- ``pod_resize.json``: ``recorded-1``'s CPU request is resized in place 300m -> 700m
  (``pods/resize``), watched until the kubelet has applied it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3] / "src"))
sys.path.insert(0, str(HERE.parents[3]))

LABEL = "rankpack.dev/recorded"


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    obj = json.loads(json.dumps(obj))
    for o in [obj, *obj.get("items", [])]:
        (o.get("metadata") or {}).pop("managedFields", None)
        inner = o.get("object")
        if isinstance(inner, dict):
            (inner.get("metadata") or {}).pop("managedFields", None)
    return obj


def main() -> int:
    from tests.k8s.pods import sleeper_pod

    from rankpack.backend.kubernetes.api.client import ClientKubeApi
    from rankpack.backend.kubernetes.api.config import load_config
    from rankpack.backend.kubernetes.api.kubeapi import ApiError
    from rankpack.devcluster.layout import NAMESPACE, Layout, default_state_dir

    layout = Layout(default_state_dir())
    api = ClientKubeApi(load_config(layout.service_account_kubeconfig, namespace=NAMESPACE))
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    query = {"labelSelector": LABEL}

    def pod(name: str, millis: int) -> dict[str, Any]:
        body = sleeper_pod(name, millis)
        body["metadata"]["labels"][LABEL] = "yes"
        return body

    def running(name: str) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            st = api.get("pods", name).get("status", {})
            cs = (st.get("containerStatuses") or [{}])[0]
            if st.get("phase") == "Running" and "running" in (cs.get("state") or {}):
                return
            time.sleep(0.3)
        raise SystemExit(f"{name} not running")

    def watch(rv: str, events: list[Any], until: threading.Event, done: Any) -> None:
        q = {**query, "resourceVersion": rv, "allowWatchBookmarks": "true"}
        try:
            for e in api.watch(path, query=q, timeout_s=90):
                events.append(strip(e))
                if done(events):
                    until.set()
                    return
        except ApiError as exc:
            print("watch:", exc)
        until.set()

    for name in ("recorded-0", "recorded-1", "recorded-2"):
        with contextlib.suppress(ApiError):
            api.delete("pods", name)
    time.sleep(3)
    api.create("pods", pod("recorded-0", 100))
    running("recorded-0")
    listed = strip(api.list_collection(path, query))
    events: list[Any] = []
    ended = threading.Event()

    def life_done(evs: list[Any]) -> bool:
        deleted = any(e["type"] == "DELETED" for e in evs)
        return deleted and evs[-1]["type"] == "BOOKMARK"

    rv = listed["metadata"]["resourceVersion"]
    t = threading.Thread(target=watch, args=(rv, events, ended, life_done), daemon=True)
    t.start()
    time.sleep(1)
    api.create("pods", pod("recorded-1", 300))
    running("recorded-1")
    api.create("pods", pod("recorded-2", 100))
    time.sleep(2)
    api.delete("pods", "recorded-2")
    ended.wait(120)
    relist = strip(api.list_collection(path, query))
    life = {"note": "recorded from the dev cluster by record_watches.py (managedFields left out)",
            "list": listed, "watch": events, "relist": relist}  # fmt: skip
    (HERE / "pod_life.json").write_text(json.dumps(life, indent=1) + "\n")
    print(f"pod_life: {len(events)} events: {[e['type'] for e in events]}")

    listed = strip(api.list_collection(path, query))
    events = []
    ended = threading.Event()

    def resized(evs: list[Any]) -> bool:
        o = evs[-1].get("object") or {}
        if o.get("metadata", {}).get("name") != "recorded-1":
            return False
        st = o.get("status", {})
        cs = (st.get("containerStatuses") or [{}])[0]
        conds = [c for c in st.get("conditions") or [] if c["type"].startswith("PodResize")]
        return ((cs.get("resources") or {}).get("requests") or {}).get("cpu") == "700m" and (
            not conds
        )

    rv = listed["metadata"]["resourceVersion"]
    t = threading.Thread(target=watch, args=(rv, events, ended, resized), daemon=True)
    t.start()
    time.sleep(1)
    patch = {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "700m"}}}]}}
    api.patch_resize("recorded-1", patch)
    ended.wait(60)
    resize = {"note": "recorded from the dev cluster by record_watches.py (managedFields left out)",
              "list": listed, "watch": events}  # fmt: skip
    (HERE / "pod_resize.json").write_text(json.dumps(resize, indent=1) + "\n")
    print(f"pod_resize: {len(events)} events: {[e['type'] for e in events]}")
    for name in ("recorded-0", "recorded-1"):
        api.delete("pods", name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
