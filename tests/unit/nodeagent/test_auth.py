"""The agent's authorization with a fake of the apiserver's reviews: 401, 403, 200, what the
SubjectAccessReview asks, and the ~10 s cache of decisions."""

from __future__ import annotations

import pytest

from rankpack.nodeagent.auth import Access, ApiReviewer, Authorizer, Verdict, bearer
from tests.fakeapi import CREATOR, OPERATOR, OPERATOR_USER, SCRAPER, FakeKubeApi
from tests.fakeclock import FakeClock

READ = Access("get", "runs")


def authorizer() -> tuple[Authorizer, FakeKubeApi, FakeClock]:
    """The real reviewer over the fake apiserver (its TokenReview and SubjectAccessReview)."""
    reviews, clock = FakeKubeApi(), FakeClock(100.0)
    return Authorizer(ApiReviewer(reviews), ttl_s=10.0, clock=clock), reviews, clock


@pytest.mark.parametrize(
    ("header", "access", "verdict"),
    [
        (None, READ, Verdict.UNAUTHENTICATED),
        ("", READ, Verdict.UNAUTHENTICATED),
        (f"Basic {OPERATOR}", READ, Verdict.UNAUTHENTICATED),
        ("Bearer ", READ, Verdict.UNAUTHENTICATED),
        ("Bearer not-a-token-the-apiserver-knows", READ, Verdict.UNAUTHENTICATED),
        (f"Bearer {CREATOR}", READ, Verdict.FORBIDDEN),
        (f"Bearer {OPERATOR}", READ, Verdict.ALLOWED),
        (f"bearer {OPERATOR}", Access("update", "runs"), Verdict.ALLOWED),
        (f"Bearer {OPERATOR}", Access("get", "other"), Verdict.FORBIDDEN),
        (f"Bearer {OPERATOR}", Access("get", ""), Verdict.FORBIDDEN),  # every namespace
        (f"Bearer {OPERATOR}", Access("get", path="/metrics"), Verdict.FORBIDDEN),
        (f"Bearer {SCRAPER}", Access("get", path="/metrics"), Verdict.ALLOWED),
        (f"Bearer {SCRAPER}", READ, Verdict.FORBIDDEN),
    ],
)
def test_verdicts(header: str | None, access: Access, verdict: Verdict) -> None:
    auth, _, _ = authorizer()
    assert auth.check(header, access).verdict is verdict


def test_no_token_asks_the_apiserver_nothing() -> None:
    auth, reviews, _ = authorizer()
    auth.check(None, READ)
    auth.check("Bearer a b", READ)
    auth.check("Bearer " + "x" * 20000, READ)
    assert reviews.tokens_reviewed == [] and reviews.access_reviewed == []


def test_the_access_review_names_the_user_and_the_ranks() -> None:
    auth, reviews, _ = authorizer()
    decision = auth.check(f"Bearer {OPERATOR}", Access("update", "runs"))
    assert decision.user == OPERATOR_USER
    (spec,) = reviews.access_reviewed
    assert spec == {
        "user": OPERATOR_USER,
        "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["op-0"]},
        "resourceAttributes": {"group": "rankpack.dev", "resource": "ranks", "verb": "update",
                               "namespace": "runs"},
    }  # fmt: skip
    denied = auth.check(f"Bearer {CREATOR}", READ)
    assert "may not get ranks.rankpack.dev in namespace runs" in denied.reason


def test_decisions_are_cached_per_token_and_attributes_for_the_ttl() -> None:
    auth, reviews, clock = authorizer()
    for _ in range(5):
        assert auth.check(f"Bearer {OPERATOR}", READ).verdict is Verdict.ALLOWED
        assert auth.check(f"Bearer {CREATOR}", READ).verdict is Verdict.FORBIDDEN
    assert len(reviews.tokens_reviewed) == 2
    auth.check(f"Bearer {OPERATOR}", Access("update", "runs"))  # other attributes: asked
    assert len(reviews.access_reviewed) == 3
    clock.t += 9.9
    auth.check(f"Bearer {OPERATOR}", READ)
    assert len(reviews.tokens_reviewed) == 3
    clock.t += 0.2  # the first decision is 10.1 s old: asked again
    auth.check(f"Bearer {OPERATOR}", READ)
    assert len(reviews.tokens_reviewed) == 4
    assert all(OPERATOR not in key for key in auth._cache)  # hashes, never the token


def test_an_apiserver_that_does_not_answer_is_503_and_not_cached() -> None:
    auth, reviews, _ = authorizer()
    reviews.down = True
    assert auth.check(f"Bearer {OPERATOR}", READ).verdict is Verdict.UNAVAILABLE
    reviews.down = False
    assert auth.check(f"Bearer {OPERATOR}", READ).verdict is Verdict.ALLOWED


def test_the_cache_is_bounded() -> None:
    auth = Authorizer(ApiReviewer(FakeKubeApi()), max_entries=3)
    for i in range(10):
        auth.check(f"Bearer bad-{i}", READ)
    assert len(auth._cache) == 3


def test_bearer() -> None:
    assert bearer("Bearer abc.def") == "abc.def"
    assert bearer("  Bearer   abc  ") == "abc"
    assert bearer("Bearer a\x00b") is None
    assert bearer("Bearer é") is None


def test_the_reviews_are_posted_to_the_review_apis() -> None:
    rest = FakeKubeApi(users={"t": {"username": "u"}})
    reviewer = ApiReviewer(rest)
    assert reviewer.review_token("t") == {"authenticated": True, "user": {"username": "u"}}
    assert reviewer.review_access({"user": "u"}) == {
        "allowed": False, "reason": "no RBAC rule allows it"}  # fmt: skip
    assert rest.sent == [
        ("POST", "/apis/authentication.k8s.io/v1/tokenreviews",
         {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
          "spec": {"token": "t"}}),
        ("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
         {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
          "spec": {"user": "u"}}),
    ]  # fmt: skip
