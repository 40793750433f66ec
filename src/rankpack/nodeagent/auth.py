"""Who may ask the node agent what: bearer tokens checked by the apiserver.

A request carries ``Authorization: Bearer TOKEN``. `Authorizer.check` asks the apiserver
(through a `Reviewer`: `ApiReviewer` on the project's REST boundary, a fake in tests) a
TokenReview (who is this?) and, if the token is authenticated, a SubjectAccessReview for
that user, groups, uid and extra: ``resourceAttributes`` {group ``rankpack.dev``, resource
``ranks``, verb ``get`` (read) or ``update`` (wait modes), namespace NS, or "" for every
namespace}; ``/metrics`` asks ``nonResourceAttributes`` {path ``/metrics``, verb ``get``},
what Prometheus' ClusterRoles grant (the kube-rbac-proxy convention). No token, or one the
apiserver does not authenticate: 401; authenticated but not allowed: 403; the apiserver not
answering: 503 (never cached). Decisions are cached for ``ttl_s`` (10 s) keyed by a SHA-256
of the token and the attributes, so a scraper or the backend polling every half second costs
the apiserver two reviews per 10 s, and tokens are neither kept nor logged in clear.
"""

from __future__ import annotations

import enum
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rankpack.backend.kubernetes.api.kubeapi import ApiError

Obj = dict[str, Any]

GROUP = "rankpack.dev"
RESOURCE = "ranks"
MAX_TOKEN = 16 << 10
"""Longer bearer tokens are refused without a review (ServiceAccount JWTs are ~1 KiB)."""


class Verdict(enum.Enum):
    ALLOWED = 200
    UNAUTHENTICATED = 401
    FORBIDDEN = 403
    UNAVAILABLE = 503
    """The apiserver could not be asked: try again."""


@dataclass(frozen=True)
class Access:
    """What a request asks to do."""

    verb: str
    """``get`` or ``update``."""
    namespace: str = ""
    """The ranks' namespace; "" for every namespace."""
    path: str = ""
    """A non-resource path (``/metrics``); then verb and path are what is reviewed."""

    def attributes(self) -> Obj:
        if self.path:
            return {"nonResourceAttributes": {"path": self.path, "verb": self.verb}}
        return {"resourceAttributes": {"group": GROUP, "resource": RESOURCE, "verb": self.verb,
                                       "namespace": self.namespace}}  # fmt: skip


@dataclass(frozen=True)
class AuthDecision:
    """What `Authorizer.check` decided about one request, and for whom."""

    verdict: Verdict
    reason: str = ""
    user: str = ""


class Reviewer(Protocol):
    """The apiserver's two review APIs (their ``status``); ApiError when it cannot answer."""

    def review_token(self, token: str) -> Obj: ...
    def review_access(self, spec: Obj) -> Obj: ...


class Requester(Protocol):
    def request(self, method: str, path: str, *, body: Obj | None = None) -> Obj: ...


class ApiReviewer:
    """`Reviewer` through the project's REST boundary (`ClientKubeApi.request`)."""

    def __init__(self, api: Requester) -> None:
        self.api = api

    def review_token(self, token: str) -> Obj:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token}}  # fmt: skip
        answer = self.api.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body)
        return dict(answer.get("status") or {})

    def review_access(self, spec: Obj) -> Obj:
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": spec}  # fmt: skip
        path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        return dict(self.api.request("POST", path, body=body).get("status") or {})


class Authorizer:
    """`check`: the decision for a request's Authorization header and what it asks."""

    def __init__(
        self,
        reviewer: Reviewer,
        *,
        ttl_s: float = 10.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reviewer = reviewer
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._cache: OrderedDict[str, tuple[float, AuthDecision]] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, authorization: str | None, access: Access) -> AuthDecision:
        token = bearer(authorization)
        if token is None:
            return AuthDecision(Verdict.UNAUTHENTICATED, "no bearer token")
        key = _key(token, access)
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and now - hit[0] < self.ttl_s:
                return hit[1]
        decision = self._review(token, access)
        if decision.verdict is not Verdict.UNAVAILABLE:
            with self._lock:
                self._cache[key] = (now, decision)
                self._cache.move_to_end(key)
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
        return decision

    def _review(self, token: str, access: Access) -> AuthDecision:
        try:
            who = self.reviewer.review_token(token)
        except ApiError as exc:
            return AuthDecision(Verdict.UNAVAILABLE, f"cannot review the token: {exc}")
        if not who.get("authenticated"):
            return AuthDecision(Verdict.UNAUTHENTICATED, "the token is not valid")
        user = dict(who.get("user") or {})
        spec: Obj = {"user": str(user.get("username") or ""), **access.attributes()}
        for field in ("groups", "uid", "extra"):
            if user.get(field):
                spec[field] = user[field]
        try:
            allowed = self.reviewer.review_access(spec)
        except ApiError as exc:
            return AuthDecision(Verdict.UNAVAILABLE, f"cannot review the access: {exc}")
        name = spec["user"]
        if allowed.get("allowed") and not allowed.get("denied"):
            return AuthDecision(Verdict.ALLOWED, "", name)
        where = f"namespace {access.namespace}" if access.namespace else "every namespace"
        what = f"{access.verb} {access.path}" if access.path else (
            f"{access.verb} {RESOURCE}.{GROUP} in {where}")  # fmt: skip
        why = str(allowed.get("reason") or "")
        reason = f"{name} may not {what}" + (f": {why}" if why else "")
        return AuthDecision(Verdict.FORBIDDEN, reason, name)


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header (None: none, or malformed)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN:
        return None
    if not token.isascii() or not token.isprintable() or " " in token:
        return None
    return token


def _key(token: str, access: Access) -> str:
    text = "\0".join((token, access.verb, access.namespace, access.path))
    return hashlib.sha256(text.encode()).hexdigest()
