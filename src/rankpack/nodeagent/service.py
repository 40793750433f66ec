"""The node agent's API, apart from HTTP: a request in, a `Response` out (`NodeAgent.handle`).

Routes (decision 0010):

- ``GET /healthz``: 200 ``ok``, no authentication (the readiness probe);
- ``GET /metrics``: Prometheus text of this node's rank pods (`metrics`);
- ``GET /v1/ranks[?namespace=NS]``: JSON ``{"node", "time", "ranks": [...],
  "requestedMillis"}``, one entry per rank of the running rank and group pods on this node
  (of NS, or of every namespace), as `rankwire.reading_json` writes it, and the CPU every
  live pod on this node requests (any namespace's: what the operator's placement counts,
  issue 40; a sum, nothing of any pod);
- ``PUT /v1/namespaces/NS/simulations/SIM/wait-mode`` with ``{"mode": "spin|polite|adaptive"}``:
  sets the wait mode of every rank of SIM on this node; 404 if it has none here, 409 if a
  rank's record is not published yet (nothing is changed then), 400 for a bad body;
- ``PUT /v1/namespaces/NS/pods/POD/nices`` with ``{"nices": {"0": 12, "1": 0}}`` (rank ->
  nice value 0..19, at most ``quantities.MAX_RANKS``): sets those ranks' nice values in
  their group pod (decision 0012); 200 ``{"node", "pod", "ranks"}``, 404 if POD is not a
  running rank or group pod of NS here, 409 if a rank's process is not known yet (nothing
  is changed then) or the pod does not hold a rank, 400 for a bad body.

Every route but ``/healthz`` is authorized first (`auth`); both PUTs need ``update``. The
rank and group pods are those the API holds on this node (`RankPods`: ``spec.nodeName``
field selector, rankpack's label, all namespaces; a pod with a rank or group label), read
at most once a second from a cache that lists them once and then watches (`rankpack
node-agent` builds it on `backend.kubernetes.informer`).
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
    holds_ranks,
)
from rankpack.backend.kubernetes.nodes.rankwire import reading_json
from rankpack.backend.kubernetes.objects.builders import MANAGED_BY, MANAGER, SIM_LABEL
from rankpack.backend.kubernetes.objects.status import pod_request_millis
from rankpack.backend.ranknice import MAX_NICE
from rankpack.core.actions import WAIT_MODES, UnknownWaitMode, parse_wait_mode
from rankpack.errors import UserError
from rankpack.nodeagent.auth import Access, Authorizer, Verdict
from rankpack.nodeagent.metrics import AgentMetrics
from rankpack.quantities import MAX_RANKS

Obj = dict[str, Any]
log = logging.getLogger("rankpack.nodeagent")
FINISHED = ("Succeeded", "Failed")
"""Pod phases that hold no CPU request any more."""

RANK_PODS_SELECTOR = f"{MANAGED_BY}={MANAGER}"
"""rankpack's pods (a label selector cannot say "this label or that one": `RankPods` keeps
those with a rank or a group label)."""
MAX_BODY = 1 << 16
"""The largest request body read (a wait-mode body is ~20 bytes, a nices body ~12 per rank:
`quantities.MAX_RANKS` of them fit): larger is 413."""
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_WAIT_MODE = re.compile(r"^/v1/namespaces/([^/]+)/simulations/([^/]+)/wait-mode$")
_NICES = re.compile(r"^/v1/namespaces/([^/]+)/pods/([^/]+)/nices$")
_RANK_KEY = re.compile(r"0|[1-9][0-9]{0,5}")


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
    """This node's running rank and group pods from the API (of what ``list_pods`` gives,
    those `holds_ranks`), listed at most once per ``ttl_s``; while the API does not answer,
    the last list is kept (None: never listed)."""

    list_pods: Callable[[], list[Obj]]
    list_node: Callable[[], list[Obj]] | None = None
    """Every pod bound to this node, whoever's (None: not known here)."""
    ttl_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    _pods: list[Obj] | None = None
    _t: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def requested_millis(self) -> int | None:
        """What every live pod on this node requests (the scheduler's sum: other tenants'
        and system pods too, which the operator cannot see); None when not known."""
        if self.list_node is None:
            return None
        try:
            pods = self.list_node()
        except ApiError as exc:
            log.warning("cannot list this node's pods: %s", exc)
            return None
        live = [p for p in pods if (p.get("status") or {}).get("phase") not in FINISHED]
        return sum(pod_request_millis(p) for p in live)

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
                self._pods = [p for p in pods if holds_ranks(p)
                              and (p.get("status") or {}).get("phase") == "Running"]  # fmt: skip
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
            refused = self._put(method, authorization, namespace, sim, "simulation")
            return "wait-mode", refused or self._wait_mode(namespace, sim, body)
        found = _NICES.match(path)
        if found:
            namespace, name = (urllib.parse.unquote(g) for g in found.groups())
            refused = self._put(method, authorization, namespace, name, "pod")
            return "nices", refused or self._nices(namespace, name, body)
        return "other", Response.error(404, f"no route {path[:100]}")

    def _put(
        self, method: str, authorization: str | None, namespace: str, name: str, kind: str
    ) -> Response | None:
        """Why a ``PUT`` on ``namespace``'s ``name`` (a ``kind``) is refused: not a PUT
        (405), names that are not names (404), not allowed to update in the namespace
        (401/403); None: go on."""
        refused = self._only(method, "PUT")
        if refused is None and not (_NAME.match(namespace) and _NAME.match(name)):
            refused = Response.error(404, f"no such namespace or {kind} name")
        return refused or self._auth(authorization, Access("update", namespace))

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
        body: Obj = {
            "node": self.node,
            "time": stamp,
            "ranks": [reading_json(who, reading) for who, reading in readings],
        }
        requested = self.pods.requested_millis()
        if requested is not None:  # the node's whole CPU request: placement counts it
            body["requestedMillis"] = requested
        return Response.json(200, body)

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

    def _nices(self, namespace: str, name: str, body: bytes | None) -> Response:
        nices = parse_nices(body)
        if nices is None:
            return Response.error(400, 'the body must be {"nices": {"<rank>": <nice 0..'
                                  f'{MAX_NICE}>, ...}}, at most {MAX_RANKS} ranks')  # fmt: skip
        pods = self.pods.get()
        if pods is None:
            return Response.error(503, "the rank pods of this node cannot be listed yet")
        mine = [p for p in pods if _meta(p, "namespace") == namespace and _meta(p, "name") == name]
        if not mine:
            return Response.error(404, f"no running rank or group pod {namespace}/{name} on "
                                  f"{self.node}")  # fmt: skip
        try:
            ranks = self.reader.set_nices(mine[0], nices)
        except NotPublished as exc:
            return Response.error(409, str(exc))
        except (UserError, ValueError, OSError) as exc:
            return Response.error(409, f"cannot set the nice values: {exc}")
        log.info("%s/%s: ranks %s nice %s", namespace, name, ranks, [nices[r] for r in ranks])
        return Response.json(200, {"node": self.node, "pod": name, "ranks": ranks})

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
                out.extend(self.reader.readings_of(pod))
            except ValueError as exc:  # not a rank pod's uid, rank or ranks: nothing is read
                log.warning("skipping pod %s: %s", _meta(pod, "name"), exc)
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


def parse_nices(body: bytes | None) -> dict[int, int] | None:
    """A nices body's rank -> nice value; None unless it is ``{"nices": {...}}`` with 1 to
    `quantities.MAX_RANKS` entries, each a rank's digits and an integer 0..19."""
    try:
        data = json.loads(body or b"")
    except ValueError:
        return None
    nices = data.get("nices") if isinstance(data, dict) else None
    if not isinstance(nices, dict) or not 0 < len(nices) <= MAX_RANKS:
        return None
    out: dict[int, int] = {}
    for key, value in nices.items():
        if not _RANK_KEY.fullmatch(key) or isinstance(value, bool) or not isinstance(value, int):
            return None
        if not 0 <= value <= MAX_NICE:
            return None
        out[int(key)] = value
    return out


def _meta(pod: Obj, key: str) -> Any:
    return (pod.get("metadata") or {}).get(key)
