"""The node agent's API, apart from HTTP: a request in, a `Response` out (`NodeAgent.handle`).

Routes (decision 0010):

- ``GET /healthz``: 200 ``ok``, no authentication (the readiness probe);
- ``GET /metrics``: Prometheus text of this node's rank pods (`metrics`);
- ``GET /v1/ranks[?namespace=NS]``: JSON ``{"node", "time", "ranks": [...]}``, one entry per
  running rank pod on this node (of NS, or of every namespace), as
  `nodereader.reading_json` writes it;
- ``PUT /v1/namespaces/NS/simulations/SIM/wait-mode`` with ``{"mode": "spin|polite|adaptive"}``:
  sets the wait mode of every rank of SIM on this node; 404 if it has none here, 409 if a
  rank's record is not published yet (nothing is changed then), 400 for a bad body.

Every route but ``/healthz`` is authorized first (`auth`). The rank pods are those the API
holds on this node (`RankPods`: ``spec.nodeName`` field selector, rankpack's labels, all
namespaces), read at most once a second from a cache that lists them once and then watches
(`rankpack node-agent` builds it on `backend.kubernetes.informer`).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rankpack.backend.kubernetes.api.kubeapi import ApiError
from rankpack.backend.kubernetes.nodes.nodereader import (
    NodeRankReading,
    NodeReader,
    NotPublished,
    RankPod,
    rank_pod,
    reading_json,
)
from rankpack.backend.kubernetes.objects.builders import MANAGED_BY, MANAGER, RANK_LABEL, SIM_LABEL
from rankpack.core.actions import WAIT_MODES, UnknownWaitMode, parse_wait_mode
from rankpack.errors import UserError
from rankpack.nodeagent.auth import Access, Authorizer, Verdict
from rankpack.nodeagent.metrics import AgentMetrics

Obj = dict[str, Any]
log = logging.getLogger("rankpack.nodeagent")

RANK_PODS_SELECTOR = f"{MANAGED_BY}={MANAGER},{RANK_LABEL}"
MAX_BODY = 4096
"""The largest request body read (a wait-mode body is ~20 bytes): larger is 413."""
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_WAIT_MODE = re.compile(r"^/v1/namespaces/([^/]+)/simulations/([^/]+)/wait-mode$")


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def json(cls, status: int, data: Obj) -> Response:
        return cls(status, (json.dumps(data, sort_keys=True) + "\n").encode())

    @classmethod
    def error(cls, status: int, message: str) -> Response:
        return cls.json(status, {"error": message})


@dataclass
class RankPods:
    """This node's running rank pods from the API, listed at most once per ``ttl_s``; while
    the API does not answer, the last list is kept (None: never listed)."""

    list_pods: Callable[[], list[Obj]]
    ttl_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    _pods: list[Obj] | None = None
    _t: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self) -> list[Obj] | None:
        with self._lock:
            now = self.clock()
            if self._t is None or now - self._t >= self.ttl_s:
                try:
                    pods = self.list_pods()
                except ApiError as exc:
                    log.warning("cannot list this node's rank pods: %s", exc)
                    self._t = now  # not again before ttl_s: the apiserver may be struggling
                    return self._pods
                self._pods = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
                self._t = now
            return self._pods


class NodeAgent:
    """The API of one node's agent."""

    def __init__(
        self,
        node: str,
        reader: NodeReader,
        pods: RankPods,
        authorizer: Authorizer,
        *,
        metrics: AgentMetrics | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.reader = reader
        self.pods = pods
        self.authorizer = authorizer
        self.metrics = metrics or AgentMetrics()
        self.metrics.readings = self.readings
        self.wall = wall

    def handle(
        self, method: str, target: str, authorization: str | None, body: bytes | None
    ) -> Response:
        """Answer one request (``target``: the request line's path and query)."""
        url = urllib.parse.urlsplit(target)
        route, response = self._route(method, url, authorization, body)
        self.metrics.count(route, response.status)
        return response

    def _route(
        self, method: str, url: urllib.parse.SplitResult, authorization: str | None,
        body: bytes | None,
    ) -> tuple[str, Response]:  # fmt: skip
        path = url.path
        if path == "/healthz":
            return "healthz", self._only(method, "GET") or Response(200, b"ok\n", "text/plain")
        if path == "/metrics":
            refused = self._only(method, "GET") or self._auth(
                authorization, Access("get", path=path)
            )
            return "metrics", refused or Response(200, self.metrics.text(),
                                                  self.metrics.content_type)  # fmt: skip
        if path == "/v1/ranks":
            return "ranks", self._only(method, "GET") or self._ranks(url.query, authorization)
        found = _WAIT_MODE.match(path)
        if found:
            namespace, sim = (urllib.parse.unquote(g) for g in found.groups())
            refused = self._only(method, "PUT")
            if refused is None and not (_NAME.match(namespace) and _NAME.match(sim)):
                refused = Response.error(404, "no such namespace or simulation name")
            refused = refused or self._auth(authorization, Access("update", namespace))
            return "wait-mode", refused or self._wait_mode(namespace, sim, body)
        return "other", Response.error(404, f"no route {path[:100]}")

    # -- routes -----------------------------------------------------------------------------

    def _ranks(self, query: str, authorization: str | None) -> Response:
        try:
            params = urllib.parse.parse_qs(query, max_num_fields=8)
        except ValueError:
            return Response.error(400, "too many query parameters")
        namespace = (params.get("namespace") or [""])[-1]
        if namespace and not _NAME.match(namespace):
            return Response.error(400, "namespace is not a namespace name")
        refused = self._auth(authorization, Access("get", namespace))
        if refused is not None:
            return refused
        readings = self.readings(namespace)
        if readings is None:
            return Response.error(503, "the rank pods of this node cannot be listed yet")
        stamp = datetime.fromtimestamp(self.wall(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return Response.json(200, {
            "node": self.node,
            "time": stamp,
            "ranks": [reading_json(who, reading) for who, reading in readings],
        })  # fmt: skip

    def _wait_mode(self, namespace: str, sim: str, body: bytes | None) -> Response:
        try:
            data = json.loads(body or b"")
            mode = parse_wait_mode(data["mode"]) if isinstance(data, dict) else None
        except (ValueError, KeyError, TypeError, UnknownWaitMode):
            mode = None
        if mode is None:
            return Response.error(400, 'the body must be {"mode": "' + "|".join(WAIT_MODES) + '"}')
        pods = self.pods.get()
        if pods is None:
            return Response.error(503, "the rank pods of this node cannot be listed yet")
        mine = [p for p in pods if _meta(p, "namespace") == namespace
                and (_meta(p, "labels") or {}).get(SIM_LABEL) == sim]  # fmt: skip
        if not mine:
            return Response.error(404, f"no running rank of {namespace}/{sim} on {self.node}")
        try:
            ranks = self.reader.set_wait_modes(mine, mode)
        except NotPublished as exc:
            return Response.error(409, str(exc))
        except (UserError, ValueError, OSError) as exc:
            return Response.error(409, f"cannot set the wait mode: {exc}")
        log.info("%s/%s: ranks %s wait %s", namespace, sim, ranks, mode)
        return Response.json(200, {"node": self.node, "mode": mode, "ranks": sorted(ranks)})

    # -- helpers ----------------------------------------------------------------------------

    def readings(self, namespace: str = "") -> list[tuple[RankPod, NodeRankReading]] | None:
        """This node's running rank pods (of ``namespace``, or all) and their readings, by
        namespace, simulation and rank; None while the pods cannot be listed."""
        pods = self.pods.get()
        if pods is None:
            return None
        out = []
        for pod in pods:
            if namespace and _meta(pod, "namespace") != namespace:
                continue
            try:
                who = rank_pod(pod)
            except ValueError as exc:  # not a rank pod's uid or rank: nothing is read
                log.warning("skipping pod %s: %s", _meta(pod, "name"), exc)
                continue
            out.append((who, self.reader.read(pod)))
        return sorted(out, key=lambda x: (x[0].namespace, x[0].sim, x[0].rank, x[0].name))

    def _auth(self, authorization: str | None, access: Access) -> Response | None:
        decision = self.authorizer.check(authorization, access)
        if decision.verdict is Verdict.ALLOWED:
            return None
        if decision.verdict is Verdict.UNAUTHENTICATED:
            return Response.error(401, "unauthorized: " + decision.reason)
        if decision.verdict is Verdict.FORBIDDEN:
            return Response.error(403, "forbidden: " + decision.reason)
        log.warning("%s", decision.reason)
        return Response.error(503, "the apiserver cannot review the request now")

    @staticmethod
    def _only(method: str, allowed: str) -> Response | None:
        return None if method == allowed else Response.error(405, f"use {allowed}")


def _meta(pod: Obj, key: str) -> Any:
    return (pod.get("metadata") or {}).get(key)
