"""FakeKubeApi: the one in-memory apiserver fake of the tests, at the project's apiserver
boundary (`KubeApi` and its REST call `request`), recording every action (mpi-operator style).

Used by every unit test that talks to "the apiserver": the Kubernetes backend's (`KubeApi`),
the operator's (the real `SimulationApi` over `request`: `FakeSims` below is that client on
this fake, with the tests' views of its Simulations) and the node agent's (the real
`ApiReviewer` over `request`: TokenReview and SubjectAccessReview). The HTTP fake
(`tests.fakeapiserver`) serves it to a real client or a process.

Tests move pods through their lives themselves (`run_pod`, `settle_resize`), as the
kubelet and the scheduler would; deleting an owner garbage-collects its dependents. Lists
and watches of any collection (`list_collection`, `watch`) serve the backend's cache
(`informer`): a watch yields what changed since that collection was last listed or watched
(found by comparing, so a test may also change objects in place), each change with a new
(global) resourceVersion, then a BOOKMARK, and ends; `gone` makes the next watch of a path answer
410 Gone. Faults are options, not subclasses: `down` (nothing answers), `fail_next` (the next
calls of one method raise), `cluster_scope=False` (no cluster-wide pod list), `admit` (an
admission check of each create), `forbid_paths`, `quota_millis`, `resize_limit_millis`.
"""

from __future__ import annotations

import builtins
import copy
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankpack.backend.kubernetes.api.kubeapi import (
    ApiError,
    Conflict,
    ExecResult,
    NotFound,
    RequestCounter,
    request_labels,
)
from rankpack.backend.kubernetes.objects.status import cpu_millis
from rankpack.operator import crd
from rankpack.operator.simapi import SimulationApi
from rankpack.plan.submission import Submission

Obj = dict[str, Any]

OPERATOR = "operator-token"
"""The operator's token: allowed to read and update the ranks of namespace ``runs``."""
CREATOR = "creator-token"
"""An identity that may only create Simulations: authenticated, not allowed ranks."""
SCRAPER = "scraper-token"
OPERATOR_USER = "system:serviceaccount:rankpack:rankpack-operator"
SCRAPER_USER = "system:serviceaccount:monitoring:prometheus"


def Down(message: str) -> ApiError:
    """What the official client raises when the apiserver does not answer."""
    return ApiError(0, "Unreachable", message)


def _users() -> dict[str, Obj]:
    return {
        OPERATOR: {"username": OPERATOR_USER, "uid": "u-1",
                   "groups": ["system:serviceaccounts", "system:authenticated"],
                   "extra": {"authentication.kubernetes.io/pod-name": ["op-0"]}},
        CREATOR: {"username": "system:serviceaccount:team:submitter",
                  "groups": ["system:authenticated"]},
        SCRAPER: {"username": SCRAPER_USER},
    }  # fmt: skip


def _allowed() -> set[tuple[str, str, str]]:
    return {(OPERATOR_USER, "get", "runs"), (OPERATOR_USER, "update", "runs"),
            (SCRAPER_USER, "get", "/metrics")}  # fmt: skip


def _matches(obj: Obj, selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, eq, value = term.partition("=")
        if eq and labels.get(key) != value:
            return False
        if not eq and key not in labels:
            return False
    return True


def _field(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _fields_match(obj: Obj, selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if _field(obj, key) == value:
                return False
        else:
            key, _, value = term.replace("==", "=").partition("=")
            if _field(obj, key) != value:
                return False
    return True


@dataclass
class FakeKubeApi:
    namespace: str = "rankpack"
    objects: dict[tuple[str, str], Obj] = field(default_factory=dict)
    actions: list[tuple[str, ...]] = field(default_factory=list)
    nodes: list[Obj] = field(default_factory=list)
    leases: list[Obj] = field(default_factory=list)
    """The nodes' Leases (``kube-node-lease``)."""
    other_pods: list[Obj] = field(default_factory=list)
    """Pods of other namespaces (counted by `inventory`)."""
    resize_limit_millis: int | None = None
    """Refuse resizes above this with Forbidden, like 1.36 above allocatable."""
    forbid_nodes: bool = False
    quota_millis: int | None = None
    """The ResourceQuota admission: refuse a pod create or a resize that takes the pods'
    CPU requests past this, with 403 ``exceeded quota`` (the quota's object, which the
    backend reads, is whatever a test puts in ``reconcile``: it may be stale)."""
    events: list[Obj] = field(default_factory=list)
    token: str | None = "backend-token"
    requests: RequestCounter = field(default_factory=RequestCounter)
    gone: set[str] = field(default_factory=set)
    """Paths whose next watch answers 410 Gone (as after etcd's compaction)."""
    _uids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _rv: itertools.count[int] = field(default_factory=lambda: itertools.count(2))
    rv_now: int = 1
    forbid_paths: set[str] = field(default_factory=set)
    """Collections this identity may not list nor watch (403), e.g. ``/api/v1/pods``."""
    down: bool = False
    """The apiserver does not answer: every call raises `Down`."""
    fail_next: dict[str, list[ApiError]] = field(default_factory=dict)
    """Method name (``list_pods``, ``request``, ...) -> the errors its next calls raise."""
    cluster_scope: bool = True
    """False: an identity that may not list pods cluster-wide (`list_pods_all_namespaces`
    answers 403; the other namespaces' pods only through `list_pods_in`)."""
    admit: Callable[[str, Obj], None] | None = None
    """An admission check of each create (kind, body), e.g. the LimitRanger's: raises to refuse."""
    simulations: dict[str, dict[str, Obj]] = field(default_factory=dict)
    """namespace -> name -> Simulation (the custom resource, served by `request`)."""
    status_patches: list[tuple[str, Obj]] = field(default_factory=list)
    """(name, status) of every merge patch of a Simulation's status, in order."""
    sent: list[tuple[str, str, Obj | None]] = field(default_factory=list)
    """(method, path, body) of every `request`; lists and watches of collections as
    ``("GET", path, None)`` and ``("WATCH", path, None)``."""
    users: dict[str, Obj] = field(default_factory=_users)
    """token -> the user a TokenReview authenticates it as."""
    allowed: set[tuple[str, str, str]] = field(default_factory=_allowed)
    """(user, verb, namespace or non-resource path) that RBAC allows (SubjectAccessReview;
    resource attributes only for ranks.rankpack.dev)."""
    tokens_reviewed: list[str] = field(default_factory=list)
    access_reviewed: list[Obj] = field(default_factory=list)
    _snapshot: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    _history: list[tuple[int, str, tuple[str, str, str], Obj | None, Obj]] = field(
        default_factory=list
    )
    """(resourceVersion, type, (kind, namespace, name), the object before, after): what
    watches replay."""

    # -- lists and watches of any collection (the cache's) ---------------------------------

    def _next_rv(self) -> str:
        self.rv_now = next(self._rv)
        return str(self.rv_now)

    def _everything(self) -> dict[tuple[str, str, str], Obj]:
        """(kind, namespace, name) -> the stored object (not a copy), names and versions
        given to what tests wrote by hand."""
        out: dict[tuple[str, str, str], Obj] = {}
        stored = [(k, o, self.namespace) for (k, _), o in sorted(self.objects.items())]
        stored += [("pods", p, str(p.get("metadata", {}).get("namespace") or ""))
                   for p in self.other_pods]  # fmt: skip
        stored += [("nodes", n, "") for n in self.nodes]
        stored += [("leases", lease, "kube-node-lease") for lease in self.leases]
        stored += [(crd.PLURAL, o, ns) for ns, sims in sorted(self.simulations.items())
                   for o in sims.values()]  # fmt: skip
        for i, (kind, obj, ns) in enumerate(stored):
            meta = obj.setdefault("metadata", {})
            meta.setdefault("name", f"unnamed-{i}")
            out[(kind, ns, str(meta["name"]))] = obj
        return out

    def _sync(self) -> None:
        """Every change since the last call, into the history (each with a new version)."""
        now = self._everything()
        for key, obj in now.items():
            old = self._snapshot.get(key)
            if old is not None and old == obj:
                continue
            obj["metadata"]["resourceVersion"] = self._next_rv()
            what = "ADDED" if old is None else "MODIFIED"
            self._history.append((self.rv_now, what, key, old, copy.deepcopy(obj)))
        for key, old in self._snapshot.items():
            if key not in now:
                gone = copy.deepcopy(old)
                gone["metadata"]["resourceVersion"] = self._next_rv()
                self._history.append((self.rv_now, "DELETED", key, old, gone))
        self._snapshot = {k: copy.deepcopy(o) for k, o in now.items()}

    def _fault(self, call: str) -> None:
        if self.down:
            raise Down("connection refused")
        if self.fail_next.get(call):
            raise self.fail_next[call].pop(0)

    def _check(self, path: str) -> None:
        if path in self.forbid_paths or (path == "/api/v1/nodes" and self.forbid_nodes):
            raise ApiError(403, "Forbidden", f"{path} is forbidden")

    def _scope(self, path: str) -> tuple[str, str | None]:
        """(kind, namespace; None: every namespace) of a collection's path."""
        parts = [p for p in path.split("/") if p]
        parts = parts[3:] if parts[0] == "apis" else parts[2:]  # after /api/v1, /apis/G/V
        if len(parts) == 1:
            return parts[0], None
        assert parts[0] == "namespaces" and len(parts) == 3, path
        return parts[2], parts[1]

    @staticmethod
    def _words(kind: str, ns: str | None, own: str) -> tuple[str, ...]:
        if ns is None:
            return (kind,) if kind == "nodes" else (kind, "*")
        return (kind,) if ns == own else (kind, ns)

    def _in(self, kind: str, ns: str | None, query: Mapping[str, str], key: tuple[str, str, str],
            obj: Obj | None) -> bool:  # fmt: skip
        if obj is None or key[0] != kind or (ns is not None and key[1] != ns):
            return False
        return _matches(obj, query.get("labelSelector", "")) and _fields_match(
            obj, query.get("fieldSelector", "")
        )

    def list_collection(self, path: str, query: Mapping[str, str] | None = None) -> Obj:
        query = query or {}
        kind, ns = self._scope(path)
        words = self._words(kind, ns, self.namespace)
        label = [query["labelSelector"]] if "labelSelector" in query else []
        self.actions.append(("list", *words, *label))
        self.requests.add("list", kind)
        self.sent.append(("GET", path, None))
        self._fault("list_collection")
        self._check(path)
        return self._listed(kind, ns, query)

    def _listed(self, kind: str, ns: str | None, query: Mapping[str, str]) -> Obj:
        self._sync()
        items = [copy.deepcopy(o) for k, o in self._snapshot.items()
                 if self._in(kind, ns, query, k, o)]  # fmt: skip
        return {"items": items, "metadata": {"resourceVersion": str(self.rv_now)}}

    def watch(
        self, path: str, *, query: Mapping[str, str] | None = None, timeout_s: float = 60.0
    ) -> Iterator[Obj]:
        query = query or {}
        kind, ns = self._scope(path)
        self.actions.append(("watch", *self._words(kind, ns, self.namespace)))
        self.requests.add("watch", kind)
        self.sent.append(("WATCH", path, None))
        self._fault("watch")
        self._check(path)
        if path in self.gone:
            self.gone.discard(path)
            raise ApiError(410, "Expired", "too old resource version")
        self._sync()
        since = int(query.get("resourceVersion") or 0)
        events: list[Obj] = []
        for rv, kind_of, key, old, new in self._history:
            if rv <= since:
                continue
            was = self._in(kind, ns, query, key, old)
            now = kind_of != "DELETED" and self._in(kind, ns, query, key, new)
            if was or now:
                what = "MODIFIED" if was and now else "ADDED" if now else "DELETED"
                events.append({"type": what, "object": copy.deepcopy(new)})
        events.append({"type": "BOOKMARK",
                       "object": {"metadata": {"resourceVersion": str(self.rv_now)}}})  # fmt: skip
        return iter(events)

    # -- KubeApi ------------------------------------------------------------------------

    def list_nodes(self) -> list[Obj]:
        self.actions.append(("list", "nodes"))
        self._fault("list_nodes")
        if self.forbid_nodes:
            raise ApiError(403, "Forbidden", "nodes is forbidden")
        return copy.deepcopy(self.nodes)

    def list_pods_all_namespaces(
        self, field_selector: str = "", label_selector: str = ""
    ) -> list[Obj]:
        self.actions.append(("list", "pods", "*"))
        self._fault("list_pods_all_namespaces")
        if not self.cluster_scope:
            raise ApiError(403, "Forbidden", "pods is forbidden at the cluster scope")
        pods = [copy.deepcopy(o) for (k, _), o in self.objects.items() if k == "pods"] + [
            copy.deepcopy(p) for p in self.other_pods
        ]
        return [p for p in pods if _matches(p, label_selector)]

    def list_pods_in(self, namespace: str, label_selector: str) -> list[Obj]:
        self.actions.append(("list", "pods", namespace, label_selector))
        self._fault("list_pods_in")
        ours = [o for (k, _), o in sorted(self.objects.items()) if k == "pods"]
        pods = (ours if namespace == self.namespace else []) + [
            p for p in self.other_pods if p.get("metadata", {}).get("namespace") == namespace
        ]
        return [copy.deepcopy(p) for p in pods if _matches(p, label_selector)]

    def bearer_token(self) -> str | None:
        return self.token

    def list_pods(self, label_selector: str) -> list[Obj]:
        self._fault("list_pods")
        return self.list("pods", label_selector)

    def get_pod(self, name: str) -> Obj:
        return self.get("pods", name)

    def create(self, kind: str, body: Obj) -> Obj:
        self._fault("create")
        if kind == "events":
            # the apiserver's own check of a core/v1 Event without eventTime (validation of
            # events in k8s.io/kubernetes pkg/apis/core/validation/events.go)
            involved_ns = body["involvedObject"].get("namespace") or ""
            if involved_ns != self.namespace and (involved_ns or self.namespace != "default"):
                raise ApiError(422, "Invalid", "involvedObject.namespace: Invalid value: "
                               f"{involved_ns!r}: does not match event.namespace")  # fmt: skip
            self.actions.append(
                ("create", "events", body["involvedObject"]["name"], body["reason"])
            )
            self.events.append(copy.deepcopy(body))
            return copy.deepcopy(body)
        name = body["metadata"]["name"]
        self.actions.append(("create", kind, name))
        if (kind, name) in self.objects:
            raise ApiError(409, "AlreadyExists", f"{kind} {name} exists")
        if self.admit is not None:
            self.admit(kind, body)
        if kind == "pods":
            self._admit_quota(name, _request(body))
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        meta["uid"] = f"uid-{next(self._uids)}"
        meta["resourceVersion"] = self._next_rv()
        meta["generation"] = 1
        meta["namespace"] = self.namespace
        if kind == "pods":
            obj["status"] = {"phase": "Pending"}
        self.objects[(kind, name)] = obj
        return copy.deepcopy(obj)

    def get(self, kind: str, name: str) -> Obj:
        self.actions.append(("get", kind, name))
        self._fault("get")
        if (kind, name) not in self.objects:
            raise ApiError(404, "NotFound", f"{kind} {name} not found")
        return copy.deepcopy(self.objects[(kind, name)])

    def list(self, kind: str, label_selector: str) -> list[Obj]:
        self.actions.append(("list", kind, label_selector))
        self._fault("list")
        return [
            copy.deepcopy(o)
            for (k, _), o in sorted(self.objects.items())
            if k == kind and _matches(o, label_selector)
        ]

    def delete(
        self, kind: str, name: str, propagation: str = "Background", grace_s: int | None = None
    ) -> None:
        self.actions.append(("delete", kind, name, propagation) if grace_s is None
                            else ("delete", kind, name, propagation, grace_s))  # fmt: skip
        self._fault("delete")
        obj = self.objects.pop((kind, name), None)
        if obj is None:
            raise ApiError(404, "NotFound", f"{kind} {name} not found")
        uid = obj["metadata"]["uid"]
        for key, dep in list(self.objects.items()):  # the garbage collector
            owners = dep["metadata"].get("ownerReferences") or []
            if any(o["uid"] == uid for o in owners):
                del self.objects[key]

    def patch_resize(self, name: str, patch: Obj) -> Obj:
        self.actions.append(("patch", "pods/resize", name))
        self._fault("patch_resize")
        pod = self.objects.get(("pods", name))
        if pod is None:
            raise ApiError(404, "NotFound", f"pods {name} not found")
        new = patch["spec"]["containers"][0]["resources"]
        want = cpu_millis(new["requests"]["cpu"]) or 0
        self._admit_quota(name, want - _request(pod))
        if self.resize_limit_millis is not None and want > self.resize_limit_millis:
            raise ApiError(
                403, "Forbidden", "pod resize: node didn't have enough allocatable resources"
            )
        container = pod["spec"]["containers"][0]
        if container["resources"] != new:
            container["resources"] = copy.deepcopy(new)
            pod["metadata"]["generation"] += 1
            self._bump(pod)
        return copy.deepcopy(pod)

    def exec(self, pod: str, container: str, argv: Sequence[str], timeout_s: float) -> ExecResult:
        self.actions.append(("exec", pod, " ".join(argv)))
        self._fault("exec")
        return ExecResult(0, "", "")

    def _admit_quota(self, name: str, more: int) -> None:
        if self.quota_millis is None or more <= 0:
            return
        used = sum(_request(o) for (k, _), o in self.objects.items() if k == "pods")
        if used + more > self.quota_millis:
            raise ApiError(403, "Forbidden", (
                f'pods "{name}" is forbidden: exceeded quota: q, requested: requests.cpu='
                f"{more}m, used: requests.cpu={used}m, limited: requests.cpu={self.quota_millis}m"
            ))  # fmt: skip

    # -- the REST boundary (`ClientKubeApi.request`): Simulations, Events, reviews ----------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One REST call as `ClientKubeApi.request` sends it: Simulations (and their status),
        core/v1 Events, TokenReview, SubjectAccessReview, and GET of any collection."""
        self.sent.append((method, path, body))
        self.requests.add(*request_labels(method, path, query))
        self._fault("request")
        self._check(path)
        if path.endswith("/tokenreviews"):
            assert body is not None and method == "POST", (method, path)
            return {"status": self._review_token(str(body["spec"]["token"]))}
        if path.endswith("/subjectaccessreviews"):
            assert body is not None and method == "POST", (method, path)
            return {"status": self._review_access(body["spec"])}
        parts = [p for p in path.split("/") if p]
        if crd.PLURAL in parts:
            at = parts.index(crd.PLURAL)
            ns = parts[at - 1] if at >= 2 and parts[at - 2] == "namespaces" else None
            return self._simulation(method, ns, parts[at + 1 :], query or {}, body)
        if parts[-1] == "events" and method == "POST":
            assert body is not None
            return self.create("events", body)
        if parts[-1] == "events":
            selector = (query or {}).get("fieldSelector", "")
            return {"items": [copy.deepcopy(e) for e in self.events
                              if _fields_match(e, selector)]}  # fmt: skip
        assert method == "GET", (method, path)
        return self._listed(*self._scope(path), query or {})

    def _simulation(self, method: str, ns: str | None, rest: Sequence[str],
                    query: Mapping[str, str], body: Obj | None) -> Obj:  # fmt: skip
        if not rest and method == "GET":
            return self._listed(crd.PLURAL, ns, query)
        store = self.simulations.setdefault(str(ns), {})
        if not rest:
            assert method == "POST" and body is not None and ns is not None, (method, rest)
            return self.add_simulation(ns, str(body["metadata"]["name"]), body=body)
        obj = store.get(rest[0])
        if obj is None:
            raise NotFound(404, "NotFound", f"{crd.PLURAL} {rest[0]} not found")
        if method == "GET":
            return copy.deepcopy(obj)
        assert body is not None and rest[1:] == ["status"], (method, rest)
        if method == "PUT":
            if body["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
                raise Conflict(409, "Conflict", "the object has been modified")
            obj["status"] = copy.deepcopy(body["status"])
        else:  # a JSON merge patch of the status, one level deep
            current = obj.setdefault("status", {})
            for k, v in body["status"].items():
                if v is None:
                    current.pop(k, None)
                else:
                    current[k] = copy.deepcopy(v)
            self.status_patches.append((rest[0], copy.deepcopy(body["status"])))
        self._bump(obj)
        return copy.deepcopy(obj)

    def add_simulation(self, ns: str, name: str, case: str = "pitzDaily",
                       status: Obj | None = None, body: Obj | None = None) -> Obj:  # fmt: skip
        """A Simulation created in ``ns`` (of ``case``, or ``body`` as posted), stamped as the
        apiserver would (uid, resourceVersion, creationTimestamp: one second per object)."""
        store = self.simulations.setdefault(ns, {})
        if name in store:
            raise ApiError(409, "AlreadyExists", f"{crd.PLURAL} {name} exists")
        if body is None:
            body = crd.simulation(name, Submission(case=case, weights=(1, 1), budget_millis=2000))
        obj = copy.deepcopy(body)
        n = sum(len(s) for s in self.simulations.values())
        stamp = f"2026-01-01T00:{n // 60:02d}:{n % 60:02d}Z"
        rv = self._next_rv()
        obj["metadata"].update(
            namespace=ns, uid=f"uid-{ns}-{name}", resourceVersion=rv, creationTimestamp=stamp
        )
        if status is not None:
            obj["status"] = copy.deepcopy(status)
        store[name] = obj
        return copy.deepcopy(obj)

    def _review_token(self, token: str) -> Obj:
        self.tokens_reviewed.append(token)
        user = self.users.get(token)
        return {"authenticated": True, "user": user} if user else {"authenticated": False}

    def _review_access(self, spec: Obj) -> Obj:
        self.access_reviewed.append(spec)
        res, nonres = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if res is not None:
            ok = (res["group"], res["resource"]) == ("rankpack.dev", "ranks") and (
                spec["user"], res["verb"], res["namespace"]) in self.allowed  # fmt: skip
        else:
            ok = (
                nonres is not None
                and (spec["user"], nonres["verb"], nonres["path"]) in self.allowed
            )
        return {"allowed": ok, **({} if ok else {"reason": "no RBAC rule allows it"})}

    # -- what the kubelet and the scheduler would do -------------------------------------

    def _bump(self, obj: Obj) -> None:
        obj["metadata"]["resourceVersion"] = self._next_rv()

    def run_pod(self, name: str, node: str = "node-1", ip: str = "10.201.0.5") -> None:
        pod = self.objects[("pods", name)]
        res = pod["spec"]["containers"][0]["resources"]
        pod["spec"]["nodeName"] = node
        pod["status"] = {
            "phase": "Running",
            "podIP": ip,
            "observedGeneration": pod["metadata"]["generation"],
            "containerStatuses": [
                {
                    "name": "rank",
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "now"}},
                    "containerID": f"containerd://{name}",
                    "allocatedResources": {"cpu": res["requests"]["cpu"]},
                    "resources": copy.deepcopy(res),
                }
            ],
        }
        self._bump(pod)

    def set_conditions(self, name: str, *conditions: Obj) -> None:
        pod = self.objects[("pods", name)]
        pod["status"]["conditions"] = list(conditions)
        pod["status"]["observedGeneration"] = pod["metadata"]["generation"]
        self._bump(pod)

    def settle_resize(self, name: str) -> None:
        """The kubelet applied the spec's resources."""
        pod = self.objects[("pods", name)]
        res = pod["spec"]["containers"][0]["resources"]
        cs = pod["status"]["containerStatuses"][0]
        cs["resources"] = copy.deepcopy(res)
        cs["allocatedResources"] = {"cpu": res["requests"]["cpu"]}
        pod["status"]["conditions"] = []
        pod["status"]["observedGeneration"] = pod["metadata"]["generation"]
        self._bump(pod)

    def evict(self, name: str) -> None:
        pod = self.objects[("pods", name)]
        pod["status"]["phase"] = "Failed"
        pod["status"]["reason"] = "Evicted"
        pod["status"]["message"] = "The node was low on resource: memory."
        self._bump(pod)

    def writes(self) -> builtins.list[tuple[str, ...]]:
        """The actions that change something (no get, list or watch)."""
        return [a for a in self.actions if a[0] not in ("get", "list", "watch")]


def _request(pod: Obj) -> int:
    return cpu_millis(pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]) or 0


class FakeSims(SimulationApi):
    """The real `SimulationApi` of namespace ``ns`` over a `FakeKubeApi` (``fake``), with the
    operator tests' views of it: ``objs`` (name -> the stored Simulation), ``add``,
    ``patches`` (the status merge patches) and ``down``."""

    def __init__(self, fake: FakeKubeApi | None = None, namespace: str = "ns") -> None:
        self.fake = fake or FakeKubeApi(namespace=namespace)
        super().__init__(self.fake, namespace)  # type: ignore[arg-type]

    @property
    def objs(self) -> dict[str, Obj]:
        return self.fake.simulations.setdefault(self.namespace, {})

    @property
    def patches(self) -> builtins.list[tuple[str, Obj]]:
        return self.fake.status_patches

    @property
    def down(self) -> bool:
        return self.fake.down

    @down.setter
    def down(self, value: bool) -> None:
        self.fake.down = value

    def add(self, name: str, status: Obj | None = None) -> None:
        self.fake.add_simulation(self.namespace, name, status=status)
