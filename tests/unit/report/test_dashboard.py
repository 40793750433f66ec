"""`rankpack.report.dashboard`: the history ``rankpack dashboard``'s page draws, built from
successive top views of Simulation objects as the apiserver answers them (issue 42).

Each part is bounded (points, fields, ranks, cells, Simulations; the oldest dropped first),
a status out of range or out of shape (NaN, huge numbers, strings, too many fields or
ranks) is left out and the view stays JSON a browser parses; the co-location gain is the
solo-priced work over the wall time, or no number at all, with the reason."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from rankpack.report import dashboard
from rankpack.report.dashboard import History
from rankpack.report.top import top_view

Obj = dict[str, Any]


def sim(name: str, phase: str = "Running", ns: str = "team-a", **status: Any) -> Obj:
    meta = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
    return {"metadata": meta, "spec": {}, "status": {"phase": phase, **status}}


def ranks(*duty: Any) -> list[Obj]:
    return [{"rank": i, "requestMillis": 250, "cpuCores": 0.5, "duty": d}
            for i, d in enumerate(duty)]  # fmt: skip


def observe(h: History, t: float, *objs: Obj) -> Obj:
    h.observe(t, top_view(list(objs), [], None))
    view = h.view(t)
    json.dumps(view, allow_nan=False)  # what the page parses
    return view


def only(view: Obj) -> Obj:
    (s,) = view["simulations"]
    return s


def test_a_running_simulation_draws_its_residuals_heat_map_and_usage() -> None:
    h = History()
    for i in range(4):
        a = sim("a", iterations=10 * i + 10, ranks=ranks(0.2, 0.9),
                residuals={"p": 0.1 / (i + 1), "Ux": 0.5})  # fmt: skip
        view = observe(h, 100.0 + 5 * i, a)
    s = only(view)
    assert s["residuals"]["fields"] == ["Ux", "p"]
    assert s["residuals"]["points"][0] == [10, [0.5, 0.1]]
    assert [p[0] for p in s["residuals"]["points"]] == [10, 20, 30, 40]
    assert s["heat"]["ranks"] == [0, 1]
    assert s["heat"]["columns"] == [[-15.0, [0.2, 0.9]], [-10.0, [0.2, 0.9]],
                                    [-5.0, [0.2, 0.9]], [0.0, [0.2, 0.9]]]  # fmt: skip
    assert s["usage"][-1] == [0.0, 500.0, 1.0]  # requests summed (millicores), CPU (cores)
    assert s["latestResiduals"] == {"Ux": 0.5, "p": 0.025}
    # the same iteration count again (the status is written every 10 s): no new point
    s = only(observe(h, 125.0, sim("a", iterations=40, ranks=ranks(0.2, 0.9),
                                   residuals={"p": 0.01})))  # fmt: skip
    assert len(s["residuals"]["points"]) == 4 and len(s["heat"]["columns"]) == 5


def test_a_queued_one_has_no_columns_and_a_resumed_run_drops_the_later_points() -> None:
    h = History()
    s = only(observe(h, 1.0, sim("a", "Queued")))
    assert s["heat"]["columns"] == [] and s["residuals"]["points"] == []
    for i, it in enumerate((100, 200, 300)):
        observe(h, 2.0 + i, sim("a", iterations=it, residuals={"p": 0.1}, ranks=ranks(0.5)))
    s = only(observe(h, 9.0, sim("a", iterations=150, residuals={"p": 0.2}, ranks=ranks(0.5))))
    assert [p[0] for p in s["residuals"]["points"]] == [100, 150]
    # another set of ranks (relaunched on 3): another map
    s = only(observe(h, 10.0, sim("a", iterations=160, ranks=ranks(0.1, 0.2, 0.3))))
    assert s["heat"]["ranks"] == [0, 1, 2] and len(s["heat"]["columns"]) == 1


def test_every_part_is_bounded_and_the_oldest_goes_first() -> None:
    h = History()
    fields = {f"f{k:02d}": 0.5 for k in range(40)}
    for i in range(dashboard.MAX_POINTS + 50):
        h.observe(float(i), top_view([sim("a", iterations=i, residuals=fields,
                                          ranks=ranks(*[0.5] * 70))], [], None))  # fmt: skip
    s = only(h.view(1e6))
    assert len(s["residuals"]["points"]) == dashboard.MAX_POINTS
    assert s["residuals"]["points"][0][0] == 50  # the oldest dropped
    assert len(s["residuals"]["fields"]) == dashboard.MAX_FIELDS
    assert len(s["ranks"]) == dashboard.MAX_RANKS and s["rankCount"] == 70
    columns = s["heat"]["columns"]
    assert len(columns) * len(columns[0][1]) <= dashboard.MAX_CELLS
    assert columns[-1][0] == -(1e6 - (dashboard.MAX_POINTS + 49))
    # Simulations: at most MAX_SIMULATIONS followed, running ones first; gone ones dropped
    many = [sim(f"s{i:03d}", "Queued") for i in range(dashboard.MAX_SIMULATIONS + 10)]
    many.append(sim("late-runner", iterations=5, ranks=ranks(0.5)))
    view = observe(h, 2e6, *many)
    names = [s["name"] for s in view["simulations"]]
    assert len(names) == dashboard.MAX_SIMULATIONS and "late-runner" in names
    assert view["more"] == 11
    assert len(h.tracks) == dashboard.MAX_SIMULATIONS and "uid-a" not in h.tracks


@pytest.mark.parametrize(
    "bad",
    [math.nan, math.inf, -math.inf, -1.0, 1e308, 10**400, "0.5", True, None, [0.5], {"x": 1}],
)
def test_a_value_out_of_range_or_shape_is_left_out(bad: Any) -> None:
    h = History()
    odd = sim("a", iterations=bad, residuals={"p": bad, "Ux": 0.1, "x" * 10_000: 0.1},
              ranks=[{"rank": bad, "duty": bad, "cpuCores": bad, "requestMillis": bad},
                     {"rank": 1, "duty": 0.5}])  # fmt: skip
    observe(h, 1.0, odd)
    odd["status"]["iterations"] = 10
    s = only(observe(h, 2.0, odd))
    assert s["residuals"]["fields"] == ["Ux"]  # a field named out of shape is no field
    assert s["residuals"]["points"] == [[10, [0.1]]]
    assert s["heat"]["columns"][-1][1] == [None, 0.5]
    assert s["ranks"][0] == {"rank": 0, "node": None, "requestMillis": None, "cpuCores": None,
                             "duty": None, "wait": None}  # fmt: skip
    assert s["usage"][-1][1:] == [0.0, 0.0]


def test_hostile_text_and_phases_are_cut_and_the_view_stays_small() -> None:
    h = History()
    odd = sim("a", iterations=5, ranks=[{"rank": "9" * 5000, "node": "n" * 10_000}] * 3,
              progress="p" * 100_000, eta={"a": "b"}, nodes=["x"] * 10_000)  # fmt: skip
    odd["status"]["phase"] = "R" * 100_000
    odd["metadata"]["name"] = "N" * 100_000
    view = observe(h, 1.0, odd)
    s = only(view)
    assert len(s["name"]) == dashboard.MAX_NAME and len(s["phase"]) == 32
    assert s["ranks"][0]["rank"] == 0 and len(s["ranks"][0]["node"]) == 160
    assert s["eta"] is None and s["nodes"] is None
    assert len(json.dumps(view)) < 2000


def running_pair(h: History, t: float, a_iter: int, b_iter: int | None) -> Obj:
    objs = [sim("a", iterations=a_iter, ranks=ranks(0.9))]
    if b_iter is not None:
        objs.append(sim("b", iterations=b_iter, ranks=ranks(0.9)))
    return observe(h, t, *objs)["gain"]


def test_the_gain_prices_the_work_at_each_solo_rate_over_the_wall_time() -> None:
    h = History()
    # b queued while a runs alone for 100 s: a's solo rate 1 s an iteration
    observe(h, 0.0, sim("a", iterations=0, ranks=ranks(0.9)), sim("b", "Queued"))
    for t in range(10, 101, 10):
        gain = running_pair(h, float(t), t, None)
    assert gain["value"] == 1.0 and gain["why"] is None  # alone: no gain, exactly 1
    # then both side by side for 100 s: a at 0.8 iterations a second, b at 1
    for t in range(110, 201, 10):
        gain = running_pair(h, float(t), 100 + int(0.8 * (t - 100)), t - 100 if t > 110 else 10)
    assert gain["value"] is None
    assert "no solo rate yet for b" in gain["why"]
    # then b alone for 60 s: 2 s an iteration (a is done)
    for t in range(210, 271, 10):
        b = sim("b", iterations=100 + (t - 200) // 2, ranks=ranks(0.9))
        gain = observe(h, float(t), sim("a", "Succeeded", iterations=180), b)["gain"]
    # work: a's 180 iterations x 1 s + b's 125 (seen from its 10th to its 135th) x 2 s = 430 s
    # of one after another, done in 270 s of wall time (someone ran between every two polls)
    assert gain["workS"] == pytest.approx(180 * 1.0 + 125 * 2.0)
    assert gain["wallS"] == 270.0
    assert gain["value"] == pytest.approx(430 / 270, abs=1e-3)


def test_no_gain_before_a_minute_nor_without_anything_running() -> None:
    h = History()
    assert observe(h, 0.0, sim("a", "Queued"))["gain"]["why"].startswith("no Simulation seen")
    running_pair(h, 1.0, 0, None)
    gain = running_pair(h, 31.0, 30, None)
    assert gain["value"] is None and gain["why"].startswith("watched 30 s")


def test_a_dropped_simulation_keeps_its_work_in_the_gain_and_forget_drops_everything() -> None:
    h = History()
    for t in range(0, 101, 10):
        running_pair(h, float(t), t, None)  # a: 100 iterations alone, 1 s each
    # a deleted; enough new Simulations that it is dropped for room
    queued = [sim(f"q{i:03d}", "Queued") for i in range(dashboard.MAX_SIMULATIONS)]
    view = observe(h, 110.0, *queued)
    assert "uid-a" not in h.tracks
    assert view["gain"]["workS"] == pytest.approx(100.0) and view["gain"]["value"] == 1.0
    h.forget()
    view = h.view(120.0)
    assert view["simulations"] == [] and h.tracks == {}
    assert view["gain"]["value"] is None and view["nodes"] is None
