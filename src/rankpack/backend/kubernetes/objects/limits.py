"""What a namespace's ResourceQuotas and LimitRanges allow rank pods, read as data (pure).

The apiserver refuses a pod (and a ``pods/resize``) that would take the namespace past a
ResourceQuota, or whose CPU lies outside a LimitRange: one refusal in the middle of a gang
leaves a partial set of rank pods. So the backend plans within them (`ClusterCapacity`, through
`rank_bounds` and the quotas of the `Inventory`) and checks a launch against them before
it creates anything (`launch_refusal`).

Rank pods have one container with a CPU request and, unless ``--qos limits``, no limit.
A LimitRange's ``default`` CPU is then put on them as a hard limit by the apiserver, which
also bounds their request from above, and ``maxLimitRequestRatio`` bounds it from below;
``defaultRequest`` never applies (they always request CPU). A ``Pod`` LimitRange bounds
the sum of the containers: for one container, the same as ``Container``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rankpack.backend.kubernetes.objects.status import cpu_millis
from rankpack.backend.protocol import Quota, RankBounds, RankResources
from rankpack.core.failures import FailureCode

Obj = dict[str, Any]

_SCOPES_WITHOUT_RANK_PODS = {"BestEffort", "Terminating", "CrossNamespacePodAffinity"}
"""Quota scopes that never match a rank pod (it requests CPU, has no active deadline and no
cross-namespace affinity)."""


def applies_to_rank_pods(quota: Obj) -> bool:
    """Whether a ResourceQuota counts rank pods (its scopes select them): rank pods are
    NotBestEffort, NotTerminating and have no priority class."""
    spec = quota.get("spec") or {}
    if _SCOPES_WITHOUT_RANK_PODS & set(spec.get("scopes") or ()):
        return False
    for term in (spec.get("scopeSelector") or {}).get("matchExpressions") or ():
        scope, op = term.get("scopeName"), term.get("operator")
        if scope in _SCOPES_WITHOUT_RANK_PODS and op in ("Exists", "In"):
            return False
        if scope == "PriorityClass" and op in ("In", "Exists"):
            return False  # rank pods have no priority class
    return True


def cpu_quotas(quota: Obj) -> list[Quota]:
    """A ResourceQuota's CPU entries (``requests.cpu``, or ``cpu`` meaning the same;
    ``limits.cpu``), from its status (what the apiserver enforces)."""
    if not applies_to_rank_pods(quota):
        return []
    name = str((quota.get("metadata") or {}).get("name", "?"))
    st = quota.get("status") or {}
    hard, used = st.get("hard") or {}, st.get("used") or {}
    found = []
    for keys, resource in (
        (("requests.cpu", "cpu"), "requests.cpu"),
        (("limits.cpu",), "limits.cpu"),
    ):
        for key in keys:
            limit = cpu_millis(hard.get(key))
            if limit is not None:
                found.append(Quota(name, limit, cpu_millis(used.get(key)) or 0, resource))
                break
    return found


def tightest(quotas: Sequence[Quota], resource: str) -> Quota | None:
    return min(
        (q for q in quotas if q.resource == resource), key=lambda q: q.free_millis, default=None
    )


@dataclass(frozen=True)
class _Range:
    """One CPU item of a LimitRange, in millicores."""

    name: str
    kind: str
    min_millis: int | None
    max_millis: int | None
    default_limit_millis: int | None
    ratio: float | None


def _ranges(limit_ranges: Sequence[Obj]) -> list[_Range]:
    out = []
    for lr in limit_ranges:
        name = str((lr.get("metadata") or {}).get("name", "?"))
        for item in (lr.get("spec") or {}).get("limits") or ():
            kind = item.get("type")
            if kind not in ("Container", "Pod"):
                continue
            ratio = (item.get("maxLimitRequestRatio") or {}).get("cpu")
            found = _Range(
                name,
                str(kind),
                cpu_millis((item.get("min") or {}).get("cpu")),
                cpu_millis((item.get("max") or {}).get("cpu")),
                cpu_millis((item.get("default") or {}).get("cpu")) if kind == "Container" else None,
                float(cpu_millis(ratio) or 0) / 1000 if ratio is not None else None,
            )
            if any(v is not None for v in (found.min_millis, found.max_millis,
                                           found.default_limit_millis, found.ratio)):  # fmt: skip
                out.append(found)
    return out


def _describe(r: _Range) -> str:
    parts = [
        f"{label} {value}m"
        for label, value in (
            ("min", r.min_millis),
            ("max", r.max_millis),
            ("default limit", r.default_limit_millis),
        )
        if value is not None
    ]
    if r.ratio is not None:
        parts.append(f"max limit/request {r.ratio:g}")
    return f"LimitRange {r.name} ({r.kind} cpu: {', '.join(parts)})"


def rank_bounds(limit_ranges: Sequence[Obj]) -> RankBounds | None:
    """The request a rank pod (requests only) may have under the namespace's LimitRanges:
    at least every ``min`` (and the default limit / ``maxLimitRequestRatio``), at most every
    ``max`` and the default limit. None when no LimitRange bounds CPU."""
    ranges = _ranges(limit_ranges)
    if not ranges:
        return None
    default = next((r.default_limit_millis for r in ranges if r.default_limit_millis), None)
    lows = [r.min_millis for r in ranges if r.min_millis is not None]
    highs = [r.max_millis for r in ranges if r.max_millis is not None]
    if default is not None:
        highs.append(default)
        lows += [math.ceil(default / r.ratio) for r in ranges if r.ratio]
    return RankBounds(
        min_millis=max(lows, default=0),
        max_millis=min(highs, default=None),
        default_limit_millis=default,
        source="; ".join(_describe(r) for r in ranges),
    )


def _rank_violation(res: RankResources, ranges: Sequence[_Range], default: int | None) -> str:
    """What the LimitRanger (or pod validation) would say of one rank pod's CPU ('' if
    nothing)."""
    limit = res.limit_millis if res.limit_millis is not None else default
    request = res.request_millis
    if limit is not None and request > limit:
        return f"request {request}m above its CPU limit {limit}m"
    for r in ranges:
        what = _describe(r)
        if r.min_millis is not None and request < r.min_millis:
            return f"request {request}m below the minimum of {what}"
        highest = max(request, limit or 0)
        if r.max_millis is not None and highest > r.max_millis:
            return f"{'limit' if limit else 'request'} {highest}m above the maximum of {what}"
        if r.ratio is not None and limit is None:
            return (
                f"no CPU limit, which {what} requires (a max limit/request ratio); rank pods "
                "request CPU only (hard limits throttle MPI ranks)"
            )
        if r.ratio is not None and limit is not None and limit > r.ratio * request:
            return f"limit {limit}m over {r.ratio:g} x its request {request}m ({what})"
    return ""


def launch_refusal(
    pods: Sequence[tuple[str, RankResources]],
    quotas: Sequence[Quota],
    limit_ranges: Sequence[Obj],
) -> tuple[FailureCode, str] | None:
    """Why a launch of ``pods`` (name, CPU: the rank pods, and the launcher pod in pod mode)
    would be refused by the namespace's LimitRanges or ResourceQuotas, before anything is
    created: (`OUTSIDE_LIMIT_RANGE` or `QUOTA_NEEDS_LIMITS`: it never will be;
    `QUOTA_EXCEEDED`: not now), or None."""
    ranges = _ranges(limit_ranges)
    default = next((r.default_limit_millis for r in ranges if r.default_limit_millis), None)
    for name, res in pods:
        why = _rank_violation(res, ranges, default)
        if why:
            return FailureCode.OUTSIDE_LIMIT_RANGE, (
                f"{name}: {why}; the namespace's LimitRange refuses such a pod: ask for a "
                "budget within it, or ask the admin to change the LimitRange"
            )
    ranks = [res for _, res in pods]
    limits = [r.limit_millis if r.limit_millis is not None else default for r in ranks]
    for q in quotas:
        if q.resource == "limits.cpu" and any(lim is None for lim in limits):
            return FailureCode.QUOTA_NEEDS_LIMITS, (
                f"the namespace's ResourceQuota {q.name} limits limits.cpu, so every pod must "
                "set a CPU limit, and rankpack's pods request CPU only (hard limits throttle MPI "
                "ranks); ask the admin for a requests.cpu quota instead, or for a LimitRange "
                "with a default CPU limit"
            )
    for q in quotas:
        need = sum(
            (r.request_millis for r in ranks)
            if q.resource == "requests.cpu"
            else (lim or 0 for lim in limits)
        )
        if need > q.free_millis:
            return FailureCode.QUOTA_EXCEEDED, quota_message(q, need)
    return None


def quota_message(q: Quota, need: int) -> str:
    return (
        f"the namespace's ResourceQuota {q.name} has {q.free_millis}m of {q.resource} free "
        f"({q.used_millis}m of {q.hard_millis}m used) and the rank pods need {need}m; "
        "waiting until it has room"
    )
