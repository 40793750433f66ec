"""``rankpack top``'s view (pure): a cluster's Simulations and their ranks as a user reads
them with their own rights, and the nodes where that user may read nodes.

Built from what the apiserver answered (Simulation objects, their Events, the nodes or
None where they may not be read), so the same data renders as rich tables (`render`) or
JSON (`--once --json`). Everything comes from Simulation statuses the operator writes
(their ranks' requests, CPU use and duty: `rankpack.report.glance`) and Events it posts:
nothing reads a node but through them.

Each Simulation carries its uid and its latest residuals (checked as the status writer
checks them, `rankpack.report.glance.residuals_of`) for ``rankpack dashboard``'s history
(`rankpack.report.dashboard`); a number that is not finite is left out (None).

Per node, from the visible Simulations' ranks on it: CPU requested (their requests),
used (their CPU), useful (their duty, a core each); with its allocatable CPU when nodes may
be read. A user who may not read nodes sees no node table (``nodes`` is None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group
from rich.table import Table

from rankpack.report.glance import finite, residuals_of

Obj = dict[str, Any]

RECENT = 5
"""Recent resizes and wait-mode switches shown per Simulation."""
RECENT_REASONS = frozenset({"Resized", "WaitMode", "ResizeNeverApplied", "WaitModeFailed"})
MAX_TEXT = 160


def _num(value: Any) -> float | None:
    """A finite number, else None (a status is anyone's who may write it: checked)."""
    return finite(value)


def _text(value: Any, limit: int = MAX_TEXT) -> str | None:
    return str(value)[:limit] if isinstance(value, str) and value else None


def _obj(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def _rank(r: Mapping[str, Any]) -> Obj:
    wait = _obj(r.get("wait"))
    rank = _num(r.get("rank"))
    return {
        "rank": int(rank) if rank is not None and rank.is_integer() and abs(rank) < 1e9 else None,
        "node": _text(r.get("node")),
        "requestMillis": _num(r.get("requestMillis")),
        "cpuCores": _num(r.get("cpuCores")),
        "duty": _num(r.get("duty")),
        "wait": _text(wait.get("mode")),
    }


def _recent(events: Sequence[Obj]) -> list[Obj]:
    found = [e for e in events if e.get("reason") in RECENT_REASONS]
    found.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return [{"time": _text(e.get("lastTimestamp") or e.get("eventTime")),
             "reason": e.get("reason"), "message": _text(e.get("message"))}
            for e in found[-RECENT:]]  # fmt: skip


def simulation(obj: Obj, events: Sequence[Obj] = ()) -> Obj:
    """One Simulation as ``top`` shows it."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    st = obj.get("status") or {}
    duty = _obj(st.get("duty"))
    found = st.get("ranks")
    ranks: list[Any] = found if isinstance(found, list) else []
    mine = [e for e in events
            if (e.get("involvedObject") or {}).get("uid") == meta.get("uid")]  # fmt: skip
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": _text(meta.get("uid")),
        "phase": _text(st.get("phase"), 32) or "Queued",
        "reason": _text(st.get("reason")),
        "case": _text((spec.get("case") or {}).get("path")),
        "ranks": [_rank(r) for r in ranks if isinstance(r, dict)],
        "iterations": _num(st.get("iterations")),
        "expectedIterations": _num(st.get("expectedIterations")),
        "progress": _text(st.get("progress")),
        "eta": _text(st.get("eta")),
        "duty": {"mean": _num(duty.get("mean")), "min": _num(duty.get("min"))},
        "efficiency": _num(st.get("efficiency")),
        "nodes": _text(st.get("nodes")),
        "resizes": _num(st.get("resizes")),
        "residuals": residuals_of(_obj(st.get("residuals"))),
        "recent": _recent(mine),
    }


def node_rows(sims: Sequence[Obj], nodes: Sequence[Obj] | None) -> list[Obj] | None:
    """Per node, what the visible Simulations' ranks request, use and compute; None when
    nodes may not be read (``nodes`` None)."""
    if nodes is None:
        return None
    rows: dict[str, Obj] = {}
    for n in nodes:
        name = str((n.get("metadata") or {}).get("name"))
        alloc = ((n.get("status") or {}).get("allocatable") or {}).get("cpu")
        rows[name] = {"name": name, "allocatable": alloc, "requestedMillis": 0.0,
                      "usedCores": 0.0, "usefulCores": 0.0}  # fmt: skip
    for sim in sims:
        if sim["phase"] != "Running":
            continue
        for r in sim["ranks"]:
            row = rows.get(r["node"] or "")
            if row is None:
                continue
            row["requestedMillis"] += r["requestMillis"] or 0.0
            row["usedCores"] += r["cpuCores"] or 0.0
            row["usefulCores"] += r["duty"] or 0.0
    for row in rows.values():
        for k in ("usedCores", "usefulCores"):
            row[k] = round(row[k], 3)
    return sorted(rows.values(), key=lambda r: str(r["name"]))


def top_view(sims: Sequence[Obj], events: Sequence[Obj], nodes: Sequence[Obj] | None) -> Obj:
    """The whole view: Simulations (oldest first), and nodes or None."""
    shown = [simulation(o, events) for o in sims]
    return {"simulations": shown, "nodes": node_rows(shown, nodes)}


def _f(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def render(view: Obj) -> Group:
    """Rich tables: the Simulations, each running one's ranks and recent changes, nodes."""
    caption = None if view["simulations"] else "none here that these credentials may read"
    sims = Table(title="Simulations", caption=caption, expand=False)
    for col in ("name", "phase", "progress", "ETA", "duty", "min", "eff", "nodes"):
        sims.add_column(col)
    parts: list[Any] = [sims]
    for s in view["simulations"]:
        sims.add_row(str(s["name"]), str(s["phase"]), s["progress"] or "-", s["eta"] or "-",
                     _f(s["duty"]["mean"]), _f(s["duty"]["min"]), _f(s["efficiency"]),
                     s["nodes"] or "-")  # fmt: skip
        if s["phase"] != "Running" or not s["ranks"]:
            continue
        ranks = Table(title=f"{s['name']}: ranks", expand=False)
        for col in ("rank", "node", "request", "used", "duty", "wait"):
            ranks.add_column(col)
        for r in s["ranks"]:
            ranks.add_row(_f(r["rank"], "{:.0f}"), r["node"] or "-",
                          _f(r["requestMillis"], "{:.0f}m"), _f(r["cpuCores"]), _f(r["duty"]),
                          r["wait"] or "-")  # fmt: skip
        parts.append(ranks)
        if s["recent"]:
            recent = Table(title=f"{s['name']}: recent", expand=False)
            for col in ("time", "reason", "message"):
                recent.add_column(col)
            for e in s["recent"]:
                recent.add_row(e["time"] or "-", str(e["reason"]), e["message"] or "")
            parts.append(recent)
    if view["nodes"] is None:
        parts.append("nodes: not shown (these credentials may not read nodes)")
    else:
        nodes = Table(title="Nodes (rankpack's ranks)", expand=False)
        for col in ("node", "allocatable", "requested", "used", "useful"):
            nodes.add_column(col)
        for n in view["nodes"]:
            nodes.add_row(str(n["name"]), str(n["allocatable"] or "-"),
                          _f(n["requestedMillis"], "{:.0f}m"), _f(n["usedCores"]),
                          _f(n["usefulCores"]))  # fmt: skip
        parts.append(nodes)
    return Group(*parts)
