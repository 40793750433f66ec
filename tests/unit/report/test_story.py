"""The demo's closing summary: its headline says what was measured, gain or no gain."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from rankpack.cli import demo_cmd, main
from rankpack.core.results import ResizeRecord
from rankpack.report.data import IterationPace, RankWork
from rankpack.report.story import (
    Hazard,
    HazardRun,
    Payoff,
    RanksStep,
    Story,
    Workload,
    headline,
    held_reasons,
    summary_lines,
    tables,
    to_json,
)
from rankpack.store import EventRow, Store

WORKLOAD = Workload("pitzDaily-x2", "pitzDaily", 2, 48900, (1.0, 3.0), 300, 1000, 2000)
HAZARD = Hazard(
    (250, 750), 30, 45.0,
    HazardRun("requests", 2, "completed", False, 30, 4.6, IterationPace(0.13, 30, 1.5), 0, 0.0),
    HazardRun("limits", 1, "interrupted", True, 12, 45.0, IterationPace(3.2, 12, 2.0), 410, 9.0),
)  # fmt: skip
RANKS = RanksStep(
    3, "completed", 19.0,
    (RankWork(0, 12225, 0.33, 1.0, 500, 251), RankWork(1, 36675, 0.98, 1.0, 500, 749)),
    (ResizeRecord(0, 4.0, 500, 251, "completed", 0.01, "duty", "size"),
     ResizeRecord(1, 4.0, 500, 749, "completed", 0.01, "duty", "size")),
    0, 2.0,
)  # fmt: skip
PAYOFF = Payoff(1, "completed", 1.3, 1.5, 29.2, 38.0, "db", 2, 5, 0, 3, (), "/t.png")
STORY = Story(WORKLOAD, HAZARD, RANKS, PAYOFF, load_start=0.4)


def test_a_gain_is_the_headline_beside_the_limit() -> None:
    text = headline(STORY)
    assert "29.2 s instead of 38.0 s" in text and "1.30x" in text and "1.50x" in text
    lines = summary_lines(STORY)
    assert any("rank 0 holds 25% of the cells and computed 33%" in x for x in lines)
    assert any("500m->251m" in x and "0 restarts" in x for x in lines)
    assert any("iteration 24.6x slower" in x and "410 throttled" in x for x in lines)
    stalled = replace(HAZARD, limits=replace(HAZARD.limits, pace=IterationPace(43.0, 1, 2.0, True)))
    lines = summary_lines(replace(STORY, hazard=stalled))
    assert any("at least 330.8x slower" in x for x in lines)
    assert any("computes on 1.31 of them" in x and "60% of the possible gain" in x
               for x in lines)  # fmt: skip
    assert any("polite waiting" in x for x in lines)
    assert lines[-1].startswith("Measured once") and "0.4" in lines[-1]


def test_a_hazard_that_did_not_show_is_not_called_a_slowdown() -> None:
    even = replace(HAZARD, limits=replace(HAZARD.limits, pace=IterationPace(0.12, 30, 2.0)))
    lines = summary_lines(replace(STORY, hazard=even))
    assert any(x.startswith("The hazard did not show on this run") for x in lines)
    assert not any("slower" in x for x in lines)


def test_no_colocation_says_why_the_launch_was_held() -> None:
    held = replace(PAYOFF, max_concurrent_seen=1, gain=0.99, held=("cooldown", "x0.88 < x1.05"))
    text = headline(replace(STORY, payoff=held))
    assert text.startswith("No co-location gain") and "x0.88 < x1.05" in text
    assert "0.99x" in text and "1.50x" in text and "not co-location" in text
    assert not any("of the possible gain" in x for x in summary_lines(replace(STORY, payoff=held)))


def test_colocation_without_gain_is_said_plainly() -> None:
    flat = replace(PAYOFF, gain=0.9, held=("predicted x1.2",))
    story = replace(STORY, payoff=flat)
    assert headline(story).startswith("Co-locating two simulations gained nothing here: 0.90x")
    assert any(x.startswith("Why no gain") for x in summary_lines(story))
    bare = replace(STORY, payoff=replace(flat, held=()))
    (why,) = [x for x in summary_lines(bare) if x.startswith("Why no gain")]
    assert "launch gate" not in why


def test_the_cooldown_is_not_a_reason_for_the_gain() -> None:
    """The cooldown after the first launch is not why simulations did or did not gain:
    the launch-held events keep their reason code, and the story leaves that one out."""

    def held(at: float, code: str, reason: str) -> EventRow:
        return EventRow(1, None, "now", at, "launch-held", {"reason": reason, "code": code}, 1)

    events = [
        held(0.1, "cooldown", "queued simulation 2 waits 2.0 s more after the last launch"),
        EventRow(2, 1, "now", 2.0, "launch", {"reason": "fits"}, 1),
        held(3.0, "no-gain", "predicts x0.88 (needs x1.05)"),
    ]
    assert held_reasons(events) == ("predicts x0.88 (needs x1.05)",)


def test_a_gain_above_the_physical_limit_is_flagged_as_unsound() -> None:
    story = replace(STORY, payoff=replace(PAYOFF, gain=2.07, limit=1.5), load_start=2.5)
    assert headline(story).startswith("Measured 2.07x") and "not sound" in headline(story)
    lines = summary_lines(story)
    assert lines[-1].startswith("The machine was busy: measured once") and "2.5" in lines[-1]
    assert any(x.startswith("Caution") and "not sound" in x for x in lines)
    assert not any("of the possible gain" in x for x in lines)


@pytest.mark.parametrize(
    ("story", "start"),
    [
        (replace(STORY, payoff=None, interrupted=True), "The demo was interrupted"),
        (replace(STORY, payoff=None, failed="run 3 failed"), "The demo stopped early"),
        (replace(STORY, payoff=replace(PAYOFF, gain=None, baseline="missing")), "No throughput"),
    ],
)
def test_incomplete_stories_have_an_honest_headline(story: Story, start: str) -> None:
    assert headline(story).startswith(start)
    summary_lines(story)  # no exception on partial data


def test_json_and_tables_carry_the_numbers() -> None:
    data = to_json(STORY)
    assert data["payoff"]["gain"] == 1.3 and data["payoff"]["limit"] == 1.5
    assert data["hazard"]["slowdown"] == pytest.approx(3.2 / 0.13)
    assert data["hazard"]["slowdown_is_lower_bound"] is False
    assert data["hazard"]["runs"]["limits"]["stopped_at_bound"] is True
    assert data["ranks"]["waiting_cores"] == pytest.approx(0.67 + 0.02)
    assert data["summary"]["headline"] == headline(STORY)
    assert [t.title.split(".")[0] for t in tables(STORY)] == ["1", "2", "3"]


def test_demo_refuses_a_database_whose_queue_it_would_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Machine:  # the demo's only use of the backend before it refuses: the capacity
        def inventory(self) -> SimpleNamespace:
            return SimpleNamespace(allocatable_millis=2000)

    monkeypatch.setattr(demo_cmd, "LocalBackend", Machine)
    db = tmp_path / "q.db"
    store = Store(db)
    store.submit("pitzDaily", 2, {"case": "pitzDaily", "weights": [1, 1],
                                  "budget_millis": 1000})  # fmt: skip
    store.close()
    monkeypatch.setenv("RANKPACK_DB", str(db))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["demo", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "1 waiting simulations" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
