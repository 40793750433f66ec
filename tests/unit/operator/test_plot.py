"""The operator's session timeline (`plot`): earlier sessions on its clock, each run named by
its Simulation."""

from __future__ import annotations

from pathlib import Path

from rankpack.store import EventRow, Store


def test_session_timeline_puts_earlier_sessions_on_its_clock(tmp_path: Path) -> None:
    from rankpack.operator.plot import session_events

    store = Store(tmp_path / "db.sqlite")
    first = store.start_multiplex(2000, 2, "auto", "kubernetes-operator")
    store.add_event(5, "launch", {"queue_id": 1}, multiplex_id=first, t_s=1.0)
    second = store.start_multiplex(2000, 2, "auto", "kubernetes-operator")
    store.add_event(5, "adopted", {"queue_id": 1}, multiplex_id=second, t_s=0.5)
    store.add_event(5, "finished", {"status": "completed"}, multiplex_id=second, t_s=9.0)
    store.add_event(6, "adopted", {"queue_id": 2}, multiplex_id=second, t_s=0.6)
    got = session_events(store, second)
    kinds = [(e.run_id, e.kind) for e in got]
    assert (5, "launch") in kinds and (5, "adopted") in kinds  # run 5's own launch is kept
    assert (6, "launch") in kinds  # run 6 was launched before any recorded session
    launch5 = next(e for e in got if e.run_id == 5 and e.kind == "launch")
    assert launch5.t_s <= 1.0  # the earlier session started at or before this one


def test_the_timeline_names_each_run_by_its_simulation() -> None:
    from rankpack.report.figures import pyplot, timeline_axes

    at = "2026-01-01T00:00:00+00:00"
    events = [EventRow(1, 5, at, 0.0, "launch", {}, 1),
              EventRow(2, 5, at, 3.0, "finished", {"status": "completed"}, 1),
              EventRow(3, 6, at, 1.0, "launch", {}, 1)]  # fmt: skip
    plt = pyplot()
    fig, ax = plt.subplots()
    timeline_axes(ax, events, {5: "pitzdaily-a"})
    assert [t.get_text() for t in ax.get_yticklabels()] == ["run 5: pitzdaily-a", "run 6"]
    plt.close(fig)
