"""`backend.kubernetes.limits`: ResourceQuotas and LimitRanges read as data (table tests),
and the apiserver's refusals told apart (`ApiError`)."""

from __future__ import annotations

from typing import Any

import pytest

from rankpack.backend.kubernetes.api.kubeapi import ApiError
from rankpack.backend.kubernetes.objects import limits
from rankpack.backend.protocol import Quota, RankResources
from rankpack.core.failures import FailureCode

Obj = dict[str, Any]


def _quota_object(status: Obj, **spec: Any) -> Obj:
    return {"metadata": {"name": "q"}, "spec": spec, "status": status}


@pytest.mark.parametrize(
    ("quota", "want"),
    [
        pytest.param(_quota_object({"hard": {"requests.cpu": "2"},
                                    "used": {"requests.cpu": "500m"}}),
                     [("requests.cpu", 2000, 500)], id="requests"),
        pytest.param(_quota_object({"hard": {"cpu": "1"}}), [("requests.cpu", 1000, 0)],
                     id="cpu-means-requests"),
        pytest.param(_quota_object({"hard": {"limits.cpu": "4", "requests.cpu": "2"},
                             "used": {"limits.cpu": "1"}}),
                     [("requests.cpu", 2000, 0), ("limits.cpu", 4000, 1000)], id="both"),
        pytest.param(_quota_object({"hard": {"pods": "10"}}), [], id="not-cpu"),
        pytest.param(_quota_object({}, hard={"requests.cpu": "1"}), [], id="no-status-yet"),
        pytest.param(_quota_object({"hard": {"cpu": "1"}}, scopes=["BestEffort"]), [],
                     id="best-effort-scope"),
        pytest.param(_quota_object({"hard": {"cpu": "1"}}, scopes=["NotTerminating"]),
                     [("requests.cpu", 1000, 0)], id="not-terminating-scope"),
        pytest.param(_quota_object({"hard": {"cpu": "1"}}, scopeSelector={"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}), [],
                     id="priority-class-scope"),
        pytest.param(_quota_object({"hard": {"cpu": "1"}}, scopeSelector={"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "DoesNotExist"}]}),
                     [("requests.cpu", 1000, 0)], id="no-priority-class-scope"),
    ],
)  # fmt: skip
def test_cpu_quotas(quota: Obj, want: list[tuple[str, int, int]]) -> None:
    assert [(q.resource, q.hard_millis, q.used_millis) for q in limits.cpu_quotas(quota)] == want


def test_tightest_is_the_one_with_the_least_room() -> None:
    qs = [Quota("a", 4000, 1000), Quota("b", 2000, 1500), Quota("c", 100, 0, "limits.cpu")]
    found = limits.tightest(qs, "requests.cpu")
    assert found is not None and found.name == "b"


def _lr(*items: Obj) -> Obj:
    return {"metadata": {"name": "lr"}, "spec": {"limits": list(items)}}


@pytest.mark.parametrize(
    ("ranges", "want"),
    [
        pytest.param([], None, id="none"),
        pytest.param([_lr({"type": "Container", "max": {"memory": "1Gi"}})], None,
                     id="memory-only"),
        pytest.param([_lr({"type": "Container", "min": {"cpu": "100m"}, "max": {"cpu": "2"}})],
                     (100, 2000, None), id="min-max"),
        pytest.param([_lr({"type": "Pod", "max": {"cpu": "1"}}),
                      _lr({"type": "Container", "min": {"cpu": "50m"}, "max": {"cpu": "3"}})],
                     (50, 1000, None), id="pod-and-container-tightest"),
        pytest.param([_lr({"type": "Container", "default": {"cpu": "1"},
                           "maxLimitRequestRatio": {"cpu": "4"}})],
                     (250, 1000, 1000), id="default-limit-and-ratio"),
        pytest.param([_lr({"type": "Container", "defaultRequest": {"cpu": "300m"}})], None,
                     id="default-request-never-applies"),
    ],
)  # fmt: skip
def test_rank_bounds(ranges: list[Obj], want: tuple[int, int | None, int | None] | None) -> None:
    bounds = limits.rank_bounds(ranges)
    if want is None:
        assert bounds is None
    else:
        assert bounds is not None
        assert (bounds.min_millis, bounds.max_millis, bounds.default_limit_millis) == want
        assert bounds.source.startswith("LimitRange lr (")


def test_empty_bounds_and_clamp() -> None:
    bounds = limits.rank_bounds([_lr({"type": "Container", "min": {"cpu": "2"},
                                      "max": {"cpu": "1"}})])  # fmt: skip
    assert bounds is not None and bounds.empty
    ok = limits.rank_bounds([_lr({"type": "Container", "min": {"cpu": "100m"},
                                  "max": {"cpu": "1"}})])  # fmt: skip
    assert ok is not None and [ok.clamp(m) for m in (50, 500, 5000)] == [100, 500, 1000]


def test_a_launch_with_explicit_limits_fits_a_limits_quota() -> None:
    ranks = [("rank 0", RankResources(500, 500)), ("rank 1", RankResources(500, 500))]
    assert limits.launch_refusal(ranks, [Quota("q", 1000, 0, "limits.cpu")], []) is None
    code, why = limits.launch_refusal(ranks, [Quota("q", 1000, 1, "limits.cpu")], []) or (
        None, "")  # fmt: skip
    assert code is FailureCode.QUOTA_EXCEEDED and "rank pods need 1000m" in why


@pytest.mark.parametrize(
    ("message", "quota", "needs", "ranger"),
    [
        ('pods "p" is forbidden: exceeded quota: q, requested: requests.cpu=1, used: '
         "requests.cpu=1, limited: requests.cpu=1200m", True, False, False),
        ('pods "p" is forbidden: failed quota: q: must specify limits.cpu for: rank',
         False, True, False),
        ('pods "p" is forbidden: minimum cpu usage per Container is 100m, but request is 50m',
         False, False, True),
        ('pods "p" is forbidden: maximum cpu usage per Pod is 1, but limit is 2', False, False,
         True),
        ("pod resize: node didn't have enough allocatable resources", False, False, False),
    ],
)  # fmt: skip
def test_the_apiservers_refusals_told_apart(
    message: str, quota: bool, needs: bool, ranger: bool
) -> None:
    exc = ApiError(403, "Forbidden", message)
    assert (exc.quota_exceeded, exc.quota_needs_limits, exc.outside_limit_range) == (
        quota, needs, ranger)  # fmt: skip
    assert not ApiError(422, "Invalid", message).quota_exceeded
