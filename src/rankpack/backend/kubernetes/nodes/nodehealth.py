"""Which nodes are lost: judged from each node's Lease and its Ready condition (pure).

A kubelet renews its node's Lease (``kube-node-lease/<node>``) every ``leaseDurationSeconds
/ 4`` (10 s by default); the node lifecycle controller marks the node ``Ready=Unknown``
(and taints it ``node.kubernetes.io/unreachable``: nothing new is scheduled there) some
``--node-monitor-grace-period`` later (50 s by default) and evicts its pods only after five
minutes. rankpack does not wait for the eviction: a node whose Ready condition the control
plane has set ``Unknown``, or whose Lease has not been renewed for `NodeHealthRules.grace_s`
(60 s: longer than the control plane's own grace, so its verdict, with the taint that keeps
the requeued simulation's pods off the node, normally comes first; six missed renewals,
never one slow one), is **lost**, and a simulation with a rank there ends ``NodeLost``.

A node crash usually ends mpirun first, within seconds (its connections to the lost
node's ranks break), with a plain failure code: `failed_end_verdict` says whether such an
end is the node's doing. The end waits (`NodeHealthRules.hold_s` at most) until either
every node of its ranks has renewed its Lease after the end (alive: the failure is the
job's own) or one of them is lost (``NodeLost``).

**Never on a stall of the control plane.** While the apiserver is away (restarted,
overloaded) no kubelet can renew its Lease and the node lifecycle controller, once it is
back, may mark every node ``Ready=Unknown`` before their kubelets get through again. So a
Lease's age is counted only from when this process's view of the API became fresh again
(``fresh_since_s``: when the watches of the nodes and Leases came back after a break), a
``Ready=Unknown`` node counts as lost only once its Lease has also missed two renewals
(`NodeHealthRules.unknown_s`), nothing is judged while the view is broken
(`lostnodes.NodeWatch`), and when every node would be lost at once none is (the node
lifecycle controller's own "full disruption" rule: the control plane, not every node, is
what failed; one node of a one-node cluster is therefore never judged lost). A crashed node
is still lost as soon as the control plane says so (its Lease is then long stale); a node
whose kubelet renews after an apiserver restart is not.

A node whose Lease cannot be read (an identity that may not read Leases) is judged from
its Ready condition alone (once the view has been fresh for `NodeHealthRules.unknown_s`),
and a failed end is not held. A node the API no longer lists is
lost too (deleted). Called by the Kubernetes backend (`lostnodes.NodeWatch`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

Obj = dict[str, Any]

LEASE_NAMESPACE = "kube-node-lease"
DEFAULT_GRACE_S = 60.0
DEFAULT_HOLD_S = 80.0


@dataclass(frozen=True)
class NodeHealthRules:
    grace_s: float = DEFAULT_GRACE_S
    """A Lease older than this (seconds since its renewTime) makes its node lost."""
    hold_s: float = DEFAULT_HOLD_S
    """The longest a failed end waits for its nodes' verdict (seconds since the end was
    seen); then the failure stands as it is."""
    unknown_s: float = 25.0
    """A ``Ready=Unknown`` node is lost once its Lease (or, without Leases, the fresh view)
    is this much older: two missed renewals, so a kubelet that is getting through again
    after an apiserver restart is never taken for a lost one."""
    margin_s: float = 1.0
    """A Lease renewed this long after a failed end was seen shows its node alive (node
    clocks are taken to agree within it)."""


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
    fresh_since_s: float | None = None,
) -> dict[str, str]:
    """Lost nodes by name, each with why (one line). ``leases`` by node name; None: Leases
    cannot be read, judge by the Ready condition alone. ``fresh_since_s``: the POSIX time
    the view of the API came back after a break (None: never broken); a Lease's silence
    counts from then at the earliest. Every node silent at once: none (see the module
    doc)."""
    fresh = float("-inf") if fresh_since_s is None else fresh_since_s
    lost: dict[str, str] = {}
    listed: list[str] = []
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name") or "")
        if not name:
            continue
        listed.append(name)
        silent: float | None = None  # seconds its kubelet could have renewed and did not
        if leases is not None:
            age = lease_age_s(leases.get(name), now_s)
            if age is not None:
                silent = min(age, now_s - fresh)
                if silent > rules.grace_s:
                    lost[name] = (f"node {name}: its kubelet last renewed its Lease {age:.0f} s "
                                  "ago")  # fmt: skip
                    continue
        if silent is None:
            silent = now_s - fresh
        if _ready(node) == "Unknown" and silent > rules.unknown_s:
            lost[name] = f"node {name}: the control plane no longer hears from its kubelet"
    if listed and set(lost) >= set(listed):
        return {}  # every node silent at once: the control plane's stall (full disruption)
    return lost


def gone_nodes(placed_on: Iterable[str], listed: Iterable[Obj]) -> dict[str, str]:
    """Nodes ranks are placed on that the API no longer lists (deleted nodes)."""
    names = {str((n.get("metadata") or {}).get("name") or "") for n in listed}
    return {n: f"node {n} no longer exists" for n in sorted(set(placed_on)) if n and n not in names}


def ready_state(node: Obj) -> str | None:
    """The node's Ready condition's status (``True``, ``False``, ``Unknown``; None: none)."""
    return _ready(node)


def renewed_after(lease: Obj | None, t_s: float) -> bool:
    """Whether the Lease was renewed after the POSIX time ``t_s``."""
    renewed = _timestamp(((lease or {}).get("spec") or {}).get("renewTime"))
    return renewed is not None and renewed > t_s


@dataclass(frozen=True)
class EndVerdict:
    """What a failed end of a simulation is: ``lost`` (a node of its ranks is lost: the
    code is ``NodeLost``), ``alive`` (every node answered after it: the failure is the
    job's own) or ``wait`` (not known yet)."""

    state: str
    why: str = ""


def failed_end_verdict(
    placed_on: Iterable[str],
    nodes: Iterable[Obj],
    leases: Mapping[str, Obj] | None,
    ended_s: float,
    now_s: float,
    rules: NodeHealthRules = NodeHealthRules(),
    fresh_since_s: float | None = None,
) -> EndVerdict:
    """Whether a simulation whose mpirun ended with a failure (seen at the POSIX time
    ``ended_s``) ended because a node of its ranks (``placed_on``) was lost. ``leases`` by
    node name (None: they cannot be read: only a node already lost counts, nothing waits).
    A deleted node is not judged here: its pods' own status says so (``DeletionByPodGC``)."""
    wanted = sorted({n for n in placed_on if n})
    lost = lost_nodes(nodes, leases, now_s, rules, fresh_since_s)
    hit = [n for n in wanted if n in lost]
    if hit:
        return EndVerdict("lost", "; ".join(lost[n] for n in hit))
    if leases is None:
        return EndVerdict("alive", "node Leases cannot be read")
    silent = [
        n
        for n in wanted  # (a node without a Lease is judged by its Ready alone)
        if n in leases and not renewed_after(leases[n], ended_s + rules.margin_s)
    ]
    if not silent:
        return EndVerdict("alive", "every node of its ranks renewed its Lease since")
    if now_s - ended_s > rules.hold_s:
        return EndVerdict("alive", f"no node was lost within {rules.hold_s:.0f} s")
    return EndVerdict("wait", f"waiting for a Lease renewal of {', '.join(silent)} (a lost "
                              "node ends it NodeLost)")  # fmt: skip
