"""`rankpack.report.top`: ``rankpack top``'s view from what the apiserver answered (issue
42): Simulations and their ranks, recent changes by the Simulation's uid, per node what the
visible ranks request, use and compute, no node table without the right to read nodes;
status fields out of shape are left out, never a crash."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

from rankpack.report.top import RECENT, render, top_view


def sim(name: str, uid: str, phase: str, ranks: list[dict[str, Any]], **status: Any) -> Any:
    return {"metadata": {"name": name, "namespace": "rankpack", "uid": uid},
            "spec": {"case": {"path": "pitzDaily"}, "ranks": len(ranks)},
            "status": {"phase": phase, "ranks": ranks, **status}}  # fmt: skip


RANKS = [
    {"rank": 0, "node": "n1", "requestMillis": 250, "cpuCores": 0.9, "duty": 0.2,
     "wait": {"mode": "polite"}},
    {"rank": 1, "node": "n2", "requestMillis": 1750, "cpuCores": 1.0, "duty": 0.9},
]  # fmt: skip
NODES = [{"metadata": {"name": n}, "status": {"allocatable": {"cpu": "2"}}} for n in ("n1", "n2")]


def event(uid: str, reason: str, t: str, message: str = "m") -> Any:
    return {"involvedObject": {"uid": uid}, "reason": reason, "lastTimestamp": t,
            "message": message}  # fmt: skip


def test_running_simulations_ranks_recent_changes_and_nodes() -> None:
    running = sim("a", "u1", "Running", RANKS, progress="40/100", iterations=40,
                  expectedIterations=100, eta="2026-11-29T10:00:00Z",
                  duty={"mean": 0.55, "min": 0.2}, efficiency=0.55, nodes="n1,n2")  # fmt: skip
    queued = sim("b", "u2", "Queued", [])
    events = [event("u1", "Resized", f"2026-11-29T09:0{i}:00Z") for i in range(RECENT + 2)]
    events += [event("u2", "Resized", "2026-11-29T09:00:00Z"),
               event("u1", "Launched", "2026-11-29T08:59:00Z")]  # fmt: skip
    view = top_view([running, queued], events, NODES)
    a, b = view["simulations"]
    assert (a["name"], a["phase"], a["progress"], a["eta"]) == (
        "a", "Running", "40/100", "2026-11-29T10:00:00Z")  # fmt: skip
    assert [r["duty"] for r in a["ranks"]] == [0.2, 0.9] and a["ranks"][0]["wait"] == "polite"
    # the last few resizes and wait-mode switches of this Simulation only (by uid)
    assert [e["time"] for e in a["recent"]] == [f"2026-11-29T09:0{i}:00Z"
                                                for i in range(2, RECENT + 2)]  # fmt: skip
    assert [e["time"] for e in b["recent"]] == ["2026-11-29T09:00:00Z"] and b["ranks"] == []
    n1, n2 = view["nodes"]
    assert (n1["name"], n1["allocatable"], n1["requestedMillis"], n1["usedCores"],
            n1["usefulCores"]) == ("n1", "2", 250, 0.9, 0.2)  # fmt: skip
    assert (n2["requestedMillis"], n2["usefulCores"]) == (1750, 0.9)
    json.dumps(view)  # the --json output
    console = Console(record=True, width=140)
    console.print(render(view))
    text = console.export_text()
    assert "40/100" in text and "polite" in text and "Resized" in text and "n2" in text


def test_without_the_right_to_read_nodes_there_is_no_node_table() -> None:
    view = top_view([sim("a", "u1", "Running", RANKS)], [], None)
    assert view["nodes"] is None
    console = Console(record=True, width=140)
    console.print(render(view))
    assert "may not read nodes" in console.export_text()


def test_a_status_out_of_shape_is_left_out_not_a_crash() -> None:
    odd = sim("a", "u1", "Running", [{"rank": 0, "duty": "high", "cpuCores": True,
                                      "node": "x" * 10_000, "wait": "spin"}, "junk"],
              duty=[1], efficiency="1", eta=5, progress="p" * 10_000)  # fmt: skip
    (s,) = top_view([odd], [{"involvedObject": None}], NODES)["simulations"]
    (r,) = s["ranks"]
    assert r["duty"] is None and r["cpuCores"] is None and r["wait"] is None
    assert len(r["node"]) == 160 and len(s["progress"]) == 160
    assert s["duty"] == {"mean": None, "min": None} and s["efficiency"] is None
    assert s["eta"] is None
