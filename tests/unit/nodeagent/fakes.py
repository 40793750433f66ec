"""FakeApiserverReviews: the apiserver's TokenReview and SubjectAccessReview behind the
agent's `Reviewer` boundary, in memory, counting the reviews it is asked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rankpack.backend.kubernetes.api.kubeapi import ApiError

Obj = dict[str, Any]

OPERATOR = "operator-token"
CREATOR = "creator-token"
"""An identity that may only create Simulations: authenticated, not allowed ranks."""
SCRAPER = "scraper-token"
OPERATOR_USER = "system:serviceaccount:rankpack:rankpack-operator"


@dataclass
class FakeApiserverReviews:
    users: dict[str, Obj] = field(default_factory=lambda: {
        OPERATOR: {"username": OPERATOR_USER, "uid": "u-1",
                   "groups": ["system:serviceaccounts", "system:authenticated"],
                   "extra": {"authentication.kubernetes.io/pod-name": ["op-0"]}},
        CREATOR: {"username": "system:serviceaccount:team:submitter",
                  "groups": ["system:authenticated"]},
        SCRAPER: {"username": "system:serviceaccount:monitoring:prometheus"},
    })  # fmt: skip
    allowed: set[tuple[str, str, str]] = field(default_factory=lambda: {
        (OPERATOR_USER, "get", "runs"), (OPERATOR_USER, "update", "runs"),
        ("system:serviceaccount:monitoring:prometheus", "get", "/metrics"),
    })  # fmt: skip
    """(user, verb, namespace or non-resource path) that RBAC allows."""
    down: bool = False
    tokens_reviewed: list[str] = field(default_factory=list)
    access_reviewed: list[Obj] = field(default_factory=list)

    def review_token(self, token: str) -> Obj:
        if self.down:
            raise ApiError(0, "Unreachable", "apiserver down")
        self.tokens_reviewed.append(token)
        user = self.users.get(token)
        return {"authenticated": True, "user": user} if user else {"authenticated": False}

    def review_access(self, spec: Obj) -> Obj:
        if self.down:
            raise ApiError(0, "Unreachable", "apiserver down")
        self.access_reviewed.append(spec)
        res, nonres = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if res is not None:
            ok = (res["group"], res["resource"]) == ("rankpack.dev", "ranks") and (
                spec["user"], res["verb"], res["namespace"]) in self.allowed  # fmt: skip
        else:
            ok = (spec["user"], nonres["verb"], nonres["path"]) in self.allowed
        return {"allowed": ok, **({} if ok else {"reason": "no RBAC rule allows it"})}
