"""The backend's client of the node agents (``rankpack node-agent``, decision 0010).

`AgentReadings` is the ``node-agent`` `readings.Readings`: for each rank pod's node it asks
that node's agent, found by listing the pods labelled
``app.kubernetes.io/name=rankpack-node-agent`` in the agents' namespace and taking the one
whose ``spec.nodeName`` is the node (its pod IP: no Service, the dev cluster has neither
kube-proxy nor cluster DNS); the backend reads them from its cache (`cached_agents`: listed
once, then watched). ``GET /v1/ranks?namespace=NS`` is fetched once per node per
observation round (an answer is reused for ``cache_s``), with bounded timeouts, and the
backend's own bearer token (`KubeApi.bearer_token`), which the agent checks with a
TokenReview and a SubjectAccessReview (``ranks`` in ``rankpack.dev``: get, update). Its
answer has one entry per rank (several per group pod), kept by pod uid and rank. Wait
modes are set with ``PUT /v1/namespaces/NS/simulations/SIM/wait-mode``, a group pod's
ranks' nice values with ``PUT /v1/namespaces/NS/pods/POD/nices``.

A node whose agent is not found, does not answer or answers an error raises
`readings.ReadingsMissing` for its ranks (the failure is remembered for ``retry_s``, so an
unreachable agent costs one timeout per round, not one per rank).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rankpack.backend.kubernetes.api.informer import Cache, core
from rankpack.backend.kubernetes.api.kubeapi import ApiError, KubeApi, Obj
from rankpack.backend.kubernetes.nodes.nodereader import NodeRankReading, one_rank, rank_pods
from rankpack.backend.kubernetes.nodes.rankwire import reading_from_json
from rankpack.backend.kubernetes.nodes.readings import ReadingsMissing
from rankpack.backend.protocol import BackendError

AGENT_LABEL = "app.kubernetes.io/name=rankpack-node-agent"
MAX_NODE_MILLIS = 1 << 40
"""The most CPU one node's pods may request together, millicores (a bound on an answer)."""
MAX_ANSWER = 8 << 20
"""The most of an agent's answer read (a node's rank pods are a few hundred bytes each)."""


@dataclass
class _Fetch:
    t: float
    readings: dict[tuple[str, int], NodeRankReading] | None
    """(pod uid, rank) -> reading; None when the fetch failed (``error``)."""
    error: str = ""
    requested_millis: int | None = None
    """What every live pod on the node requests, as its agent counts them (None: not said)."""


class AgentReadings:
    """Readings of ranks from the node agent of each pod's node."""

    name = "node-agent"

    def __init__(
        self,
        api: KubeApi,
        *,
        agent_namespace: str,
        port: int = 8475,
        timeout_s: float = 2.0,
        cache_s: float = 0.5,
        discover_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        agents: Callable[[], list[Obj]] | None = None,
    ) -> None:
        self.api = api
        self.agent_namespace = agent_namespace
        self.agents: Callable[[], list[Obj]] = agents or (
            lambda: api.list_pods_in(agent_namespace, AGENT_LABEL)
        )
        """The agents' pods (from the backend's cache; else listed each time)."""
        self.port = port
        self.timeout_s = timeout_s
        self.cache_s = cache_s
        self.retry_s = max(cache_s, timeout_s)
        """A failed fetch is not tried again sooner (one timeout per round at most)."""
        self.discover_s = discover_s
        self.clock = clock
        self._agents: dict[str, str] = {}
        """node -> agent's address (``ip:port``)."""
        self._agents_t: float | None = None
        self._fetched: dict[tuple[str, str], _Fetch] = {}
        """(node, namespace) -> the latest fetch."""
        self.requests_s = 5.0
        """How old a node's requested CPU (`node_requests`) may be."""
        self._lock = threading.Lock()

    # -- Readings ---------------------------------------------------------------------------

    def prefetch(self, pods: Sequence[Obj]) -> None:
        for node, namespace in sorted({self._where(p) for p in pods if self._where(p)[0]}):
            self._fetch(node, namespace)

    def read(self, pod: Obj, rank: int | None = None) -> NodeRankReading | None:
        node, namespace = self._where(pod)
        if not node:
            return None
        try:
            who = one_rank(pod, rank)
        except ValueError:  # not a rank or group pod holding that rank: nothing to read
            return None
        fetch = self._fetch(node, namespace)
        if fetch.readings is None:
            raise ReadingsMissing(node, fetch.error)
        return fetch.readings.get((who.uid, who.rank))

    def set_wait_mode(self, sim_id: str, pods: Sequence[Obj], mode: str) -> None:
        by_node: dict[tuple[str, str], list[Obj]] = {}
        for pod in pods:
            where = self._where(pod)
            if not where[0]:
                raise BackendError(f"{sim_id}: a rank pod is not on a node yet; try again")
            by_node.setdefault(where, []).append(pod)
        # every rank on every node must have published its record before any is changed
        # (each agent checks its own; this checks across nodes, from fresh readings)
        for (node, namespace), on_node in sorted(by_node.items()):
            fetch = self._fetch(node, namespace, fresh=True)
            if fetch.readings is None:
                raise BackendError(f"{sim_id}: node agent on {node} unreachable: {fetch.error}")
            for pod in on_node:
                try:
                    ranks = rank_pods(pod)
                except ValueError as exc:
                    raise BackendError(f"{sim_id}: cannot set wait mode {mode}: {exc}") from exc
                for who in ranks:
                    reading = fetch.readings.get((who.uid, who.rank))
                    if reading is None or reading.shim is None:
                        raise BackendError(f"{sim_id}: the record of rank {who.rank} "
                                           f"({who.name}) is not published yet; try "
                                           "again")  # fmt: skip
        body = json.dumps({"mode": mode}).encode()
        for node, namespace in sorted(by_node):
            path = (f"/v1/namespaces/{urllib.parse.quote(namespace)}/simulations/"
                    f"{urllib.parse.quote(sim_id)}/wait-mode")  # fmt: skip
            try:
                self._request(node, "PUT", path, body)
            except _Failed as exc:
                raise BackendError(
                    f"{sim_id}: cannot set wait mode {mode} on {node}: {exc}"
                ) from exc

    def set_nices(self, sim_id: str, pod: Obj, nices: Mapping[int, int]) -> None:
        node, namespace = self._where(pod)
        name = str((pod.get("metadata") or {}).get("name") or "")
        if not node:
            raise BackendError(f"{sim_id}: pod {name} is not on a node yet; try again")
        body = json.dumps({"nices": {str(r): n for r, n in sorted(nices.items())}}).encode()
        path = (f"/v1/namespaces/{urllib.parse.quote(namespace)}/pods/"
                f"{urllib.parse.quote(name)}/nices")  # fmt: skip
        try:
            self._request(node, "PUT", path, body)
        except _Failed as exc:
            raise BackendError(f"{sim_id}: cannot set nice values of {name} on {node}: "
                               f"{exc}") from exc  # fmt: skip

    def node_requests(self, nodes: Sequence[str]) -> dict[str, int]:
        """What every live pod of each node requests, whoever's (other tenants' and system
        pods the backend cannot see), as that node's agent counts them: its last answer, at
        most `requests_s` old. A node whose agent does not answer is left out (counted from
        what the backend sees alone)."""
        found = {}
        for node in nodes:
            last = self._fetch(node, self.api.namespace, max_age_s=self.requests_s)
            if last.requested_millis is not None:
                found[node] = last.requested_millis
        return found

    # -- the agents -------------------------------------------------------------------------

    def _where(self, pod: Obj) -> tuple[str, str]:
        """(node, namespace) of a rank pod."""
        spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
        return str(spec.get("nodeName") or ""), str(meta.get("namespace") or self.api.namespace)

    def _fetch(
        self, node: str, namespace: str, *, fresh: bool = False, max_age_s: float | None = None
    ) -> _Fetch:
        """The node's latest answer: reused for `cache_s` (a failure for `retry_s`), or for
        ``max_age_s`` either way when given; asked again when ``fresh``."""
        now = self.clock()
        with self._lock:
            last = self._fetched.get((node, namespace))
        if last is not None and not fresh:
            age = now - last.t
            if max_age_s is None:
                max_age_s = self.cache_s if last.readings is not None else self.retry_s
            if age < max_age_s:
                return last
        try:
            answer = self._request(node, "GET", "/v1/ranks?" + urllib.parse.urlencode(
                {"namespace": namespace}))  # fmt: skip
            readings, requested = _parse_ranks(answer)
            fetch = _Fetch(self.clock(), readings, requested_millis=requested)
        except _Failed as exc:
            fetch = _Fetch(self.clock(), None, str(exc))
        with self._lock:
            self._fetched[(node, namespace)] = fetch
        return fetch

    def _address(self, node: str, *, relist: bool = False) -> str:
        now = self.clock()
        stale = self._agents_t is None or now - self._agents_t >= self.discover_s
        # a node without a known agent (or whose agent failed) relists, at most once a second
        if stale or (relist and (self._agents_t is None or now - self._agents_t >= 1.0)):
            try:
                pods = self.agents()
            except ApiError as exc:
                raise _Failed(f"cannot list the node agents in {self.agent_namespace}: "
                              f"{exc}") from exc  # fmt: skip
            self._agents, self._agents_t = agent_addresses(pods, self.port), now
        address = self._agents.get(node)
        if address is None:
            raise _Failed(f"no running node agent (pod labelled {AGENT_LABEL} in namespace "
                          f"{self.agent_namespace}) on {node}")  # fmt: skip
        return address

    def _request(self, node: str, method: str, path: str, body: bytes | None = None) -> bytes:
        token = self.api.bearer_token()
        if not token:
            raise _Failed("this identity has no bearer token to show the node agents (a "
                          "kubeconfig with a client certificate?)")  # fmt: skip
        try:
            address = self._address(node)
        except _Failed:
            address = self._address(node, relist=True)
        req = urllib.request.Request(f"http://{address}{path}", data=body, method=method)
        req.add_header("Authorization", f"Bearer {token}")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with _OPENER.open(req, timeout=self.timeout_s) as response:
                return bytes(response.read(MAX_ANSWER))
        except urllib.error.HTTPError as exc:
            detail = _error_text(exc)
            raise _Failed(f"{address} answered {exc.code}{detail}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            with self._lock:
                self._agents_t = None  # the agent may have moved: list them again
            reason = getattr(exc, "reason", exc)
            raise _Failed(f"{address}: {reason}") from exc


def cached_agents(cache: Cache, namespace: str) -> Callable[[], list[Obj]]:
    """The node agents' pods in ``namespace`` from ``cache`` (an `ApiError` when the
    identity may not list them, as a List would answer)."""

    def read() -> list[Obj]:
        found = cache.informer(core("pods", namespace, labels=AGENT_LABEL))
        if found.forbidden:
            raise ApiError(403, "Forbidden", f"pods in namespace {namespace} may not be listed")
        return found.items()

    return read


class _Failed(Exception):
    """An agent could not be asked (why, in one line)."""


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""No proxy from the environment: agents are addressed by pod IP on the pod network."""


def agent_addresses(pods: Sequence[Obj], port: int) -> dict[str, str]:
    """node -> ``ip:port`` of its running agent (the ready one, else the newest running)."""
    best: dict[str, tuple[tuple[bool, str], str]] = {}
    for pod in pods:
        st, spec = pod.get("status") or {}, pod.get("spec") or {}
        node, ip = spec.get("nodeName"), st.get("podIP")
        if not node or not ip or st.get("phase") != "Running":
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in st.get("conditions") or [])  # fmt: skip
        rank = (ready, str(pod.get("metadata", {}).get("creationTimestamp", "")))
        if node not in best or rank > best[node][0]:
            host = f"[{ip}]" if ":" in str(ip) else str(ip)
            best[node] = (rank, f"{host}:{port}")
    return {node: address for node, (_, address) in best.items()}


def _parse_ranks(answer: bytes) -> tuple[dict[tuple[str, int], NodeRankReading], int | None]:
    """The readings of an agent's answer, and what its node's pods request (if it says)."""
    try:
        data = json.loads(answer)
        ranks = data["ranks"]
        if not isinstance(ranks, list):
            raise ValueError("ranks is not a list")
        readings = {(str(e["uid"]), _rank(e["rank"])): reading_from_json(e) for e in ranks}
        requested = data.get("requestedMillis")
        if requested is not None and (isinstance(requested, bool) or not isinstance(
                requested, int) or not 0 <= requested <= MAX_NODE_MILLIS):  # fmt: skip
            raise ValueError(f"requestedMillis {str(requested)[:40]!r} is not millicores")
        return readings, requested
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _Failed(f"an answer that is not /v1/ranks: {exc}") from exc


def _rank(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"rank {value!r} is not a rank")
    return value


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        message = json.loads(exc.read(4096)).get("error", "")
    except (ValueError, OSError, AttributeError):
        message = ""
    return f": {str(message)[:200]}" if message else ""
