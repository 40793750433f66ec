"""Which nodes are lost: judged from each node's Lease and its Ready condition (pure).

A kubelet renews its node's Lease (``kube-node-lease/<node>``) every ``leaseDurationSeconds
/ 4`` (10 s by default); the node lifecycle controller marks the node ``Ready=Unknown``
some ``--node-monitor-grace-period`` later and evicts its pods only after five minutes.
rankpack does not wait for the eviction: a node whose Lease has not been renewed for
`NodeHealthRules.grace_s` (default 40 s: four missed renewals, never one slow one), or
whose Ready condition the control plane has already set ``Unknown``, is **lost**, and a
simulation with a rank there ends ``NodeLost`` (its ranks there cannot go on, and mpirun
would wait on their TCP connections for much longer).

A node whose Lease cannot be read (an identity that may not read Leases) is judged from
its Ready condition alone. A node the API no longer lists is lost too (deleted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

Obj = dict[str, Any]

LEASE_NAMESPACE = "kube-node-lease"
DEFAULT_GRACE_S = 40.0


@dataclass(frozen=True)
class NodeHealthRules:
    grace_s: float = DEFAULT_GRACE_S
    """A Lease older than this (seconds since its renewTime) makes its node lost."""


def _timestamp(text: object) -> float | None:
    """An RFC 3339 time of the API (``2026-11-26T03:04:05.123456Z``) as a POSIX time."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def lease_age_s(lease: Obj | None, now_s: float) -> float | None:
    """Seconds since the Lease was last renewed (None: no Lease, or no renewTime)."""
    if not lease:
        return None
    renewed = _timestamp((lease.get("spec") or {}).get("renewTime"))
    return None if renewed is None else max(0.0, now_s - renewed)


def _ready(node: Obj) -> str | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status"))
    return None


def lost_nodes(
    nodes: Iterable[Obj],
    leases: Mapping[str, Obj] | None,
    now_s: float,
    rules: NodeHealthRules = NodeHealthRules(),
) -> dict[str, str]:
    """Lost nodes by name, each with why (one line). ``leases`` by node name; None: Leases
    cannot be read, judge by the Ready condition alone."""
    lost: dict[str, str] = {}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name") or "")
        if not name:
            continue
        if leases is not None:
            age = lease_age_s(leases.get(name), now_s)
            if age is not None and age > rules.grace_s:
                lost[name] = f"node {name}: its kubelet last renewed its Lease {age:.0f} s ago"
                continue
        if _ready(node) == "Unknown":
            lost[name] = f"node {name}: the control plane no longer hears from its kubelet"
    return lost


def gone_nodes(placed_on: Iterable[str], listed: Iterable[Obj]) -> dict[str, str]:
    """Nodes ranks are placed on that the API no longer lists (deleted nodes)."""
    names = {str((n.get("metadata") or {}).get("name") or "") for n in listed}
    return {n: f"node {n} no longer exists" for n in sorted(set(placed_on)) if n and n not in names}
