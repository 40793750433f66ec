"""The project's boundary to the Kubernetes API: the `KubeApi` interface and its errors.

The backend calls only `KubeApi` (plain JSON dicts in and out, as the API spells them), so
unit tests replace it with a fake that records the list of actions (mpi-operator's style);
`client.ClientKubeApi` implements it on the official ``kubernetes`` client. Here too: the
`ApiError` family every caller catches, `RequestCounter` (what was sent, by verb and
resource) and `request_labels`. Imported by every module of the backend that talks to the
API, by the operator, the node agent and the dev cluster.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rankpack.backend.protocol import BackendError

Obj = dict[str, Any]


class ApiError(BackendError):
    """The apiserver answered with an error status (or could not be reached: status 0).

    Constructed with a status it is the subclass that names it: `NotFound` (404),
    `Conflict` (409), `Gone` (410), so callers catch what they mean."""

    def __new__(cls, status: int, reason: str = "", message: str = "") -> ApiError:
        kind = _BY_STATUS.get(status, cls) if cls is ApiError else cls
        return super().__new__(kind)

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"{reason or status}: {message}" if message else str(reason or status))
        self.status = status
        self.reason = reason
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (ApiError, (self.status, self.reason, self.message))

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def quota_exceeded(self) -> bool:
        """403 from the ResourceQuota admission: the namespace's quota has no room now
        (``exceeded quota: q, requested: requests.cpu=1, used: ..., limited: ...``). The
        apiserver says so only in the message."""
        return self.status == 403 and "exceeded quota" in self.message

    @property
    def quota_needs_limits(self) -> bool:
        """403 from the ResourceQuota admission: the quota tracks a resource the pod does not
        set (``failed quota: q: must specify limits.cpu for: rank``)."""
        return self.status == 403 and "must specify" in self.message

    @property
    def outside_limit_range(self) -> bool:
        """403 from the LimitRanger admission (``minimum cpu usage per Container is 100m, but
        request is 50m``; ``maximum ... per Pod``; ``... limit to request ratio ...``)."""
        return self.status == 403 and (
            " per Container is " in self.message or " per Pod is " in self.message
        )

    @property
    def transient(self) -> bool:
        """Worth trying again: unreachable (0), throttled (429) or a server error (5xx)."""
        return self.status in (0, 429) or self.status >= 500


class NotFound(ApiError):
    """404: the object (or the resource type: a CRD not installed) does not exist."""


class Conflict(ApiError):
    """409: it exists already, or it changed since it was read (resourceVersion)."""


class Gone(ApiError):
    """410: a watch's resourceVersion is too old; list again."""


_BY_STATUS: dict[int, type[ApiError]] = {404: NotFound, 409: Conflict, 410: Gone}


def error_from(status: int, reason: str, body: Any) -> ApiError:
    """The `ApiError` of an error answer: its Status's reason and message when the body is
    one, else the body's first 500 characters."""
    message = ""
    if body:
        try:
            parsed = json.loads(body)
            message = str(parsed.get("message", ""))
            reason = str(parsed.get("reason", reason))
        except (ValueError, AttributeError):
            message = str(body)[:500]
    return ApiError(status, reason, message)


class RequestCounter:
    """The requests this process sent to the apiserver, by verb, resource and answer
    (issue 29: requests per minute are read off it; the run JSON's ``api_requests`` and the
    operator's ``rankpack_apiserver_requests_total``). A watch counts once, when it is
    opened (its events are not requests); ``code`` is the HTTP status, 0 when no answer
    came."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.t0 = clock()
        self._counts: dict[tuple[str, str, int], int] = {}
        self._lock = threading.Lock()

    def add(self, verb: str, resource: str, code: int = 200, n: int = 1) -> None:
        with self._lock:
            key = (verb, resource, code)
            self._counts[key] = self._counts.get(key, 0) + n

    def counts(self) -> dict[tuple[str, str, int], int]:
        """(verb, resource, code) -> requests, since this counter was made."""
        with self._lock:
            return dict(self._counts)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def summary(self, since: Mapping[tuple[str, str, int], int] | None = None) -> dict[str, Any]:
        """JSON: the total, the seconds counted, requests per minute, and ``"VERB
        RESOURCE"`` -> requests (those after ``since``, an earlier `counts`, if given)."""
        by: dict[str, int] = {}
        for (verb, resource, _code), n in self.counts().items():
            n -= (since or {}).get((verb, resource, _code), 0)
            if n:
                by[f"{verb} {resource}"] = by.get(f"{verb} {resource}", 0) + n
        total = sum(by.values())
        elapsed = max(self.clock() - self.t0, 1e-9)
        per_minute = round(total * 60.0 / elapsed, 2)
        return {"total": total, "elapsed_s": round(elapsed, 3), "per_minute": per_minute,
                "by": dict(sorted(by.items()))}  # fmt: skip


def request_labels(method: str, path: str, query: Mapping[str, str] | None) -> tuple[str, str]:
    """(verb, resource) of a REST call as the apiserver names them: ``list``/``watch``/``get``
    for a GET, ``create``, ``update``, ``patch``, ``delete``; the resource with its
    subresource (``pods/resize``, ``simulations/status``)."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    # /api/v1/... or /apis/GROUP/VERSION/...
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:] if parts[:1] == ["apis"] else parts
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] if rest else "?"
    named = len(rest) >= 2
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    if method.upper() == "GET":
        if (query or {}).get("watch") in ("true", "1"):
            verb = "watch"
        else:
            verb = "get" if named else "list"
    else:
        verb = verbs.get(method.upper(), method.lower())
    return verb, resource


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str


class KubeApi(Protocol):
    """What the backend does with the API, in the API's own words (namespace-scoped but
    `list_nodes` and `list_pods_all_namespaces`; `list_collection` and `watch` take any
    collection's path: the shared cache, `informer`, is built on them)."""

    namespace: str
    requests: RequestCounter
    """Every request sent, by verb and resource."""

    def list_collection(self, path: str, query: Mapping[str, str] | None = None) -> Obj:
        """The List at ``path`` (``items`` and ``metadata.resourceVersion``)."""
        ...

    def watch(
        self, path: str, *, query: Mapping[str, str] | None = None, timeout_s: float = 60.0
    ) -> Iterator[Obj]:
        """The events of a watch on the collection at ``path`` (``query``: resourceVersion,
        selectors, allowWatchBookmarks), opened before this returns (an error to open it
        raises here); an ``ERROR`` event raises its `ApiError` (`Gone`: list again)."""
        ...

    def list_nodes(self) -> list[Obj]: ...
    def list_pods_all_namespaces(
        self, field_selector: str = "", label_selector: str = ""
    ) -> list[Obj]: ...
    def list_pods(self, label_selector: str) -> list[Obj]: ...
    def list_pods_in(self, namespace: str, label_selector: str) -> list[Obj]:
        """Pods of another namespace (the node agents')."""
        ...

    def bearer_token(self) -> str | None:
        """The token this identity authenticates with (a kubeconfig's token, or the
        in-cluster ServiceAccount token, re-read as it rotates); None for a client
        certificate. Sent to the node agents, which check it with a TokenReview."""
        ...

    def get_pod(self, name: str) -> Obj: ...
    def create(self, kind: str, body: Obj) -> Obj:
        """``kind``: ``pods``, ``services``, ``configmaps`` or ``events``."""
        ...

    def get(self, kind: str, name: str) -> Obj: ...
    def list(self, kind: str, label_selector: str) -> list[Obj]: ...
    def delete(
        self, kind: str, name: str, propagation: str = "Background", grace_s: int | None = None
    ) -> None:
        """``grace_s``: the deletion's grace period (0: at once, a pod of a lost node)."""
        ...

    def patch_resize(self, name: str, patch: Obj) -> Obj:
        """Strategic-merge patch of the ``pods/resize`` subresource."""
        ...

    def exec(self, pod: str, container: str, argv: Sequence[str], timeout_s: float) -> ExecResult:
        """Run ``argv`` in a container (``pods/exec``) and collect its output."""
        ...
