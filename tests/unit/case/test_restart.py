"""The last complete write of a decomposed case, and resuming from it."""

from __future__ import annotations

from pathlib import Path

from rankpack.case.restart import latest_written_time, resume_from

CONTROL = """FoamFile { version 2.0; format ascii; class dictionary; object controlDict; }
application simpleFoam;
startFrom startTime;
startTime 0;
stopAt endTime;
endTime 250;
deltaT 1;
writeControl timeStep;
writeInterval 50;
"""


def case(
    tmp_path: Path, writes: dict[int, list[str]], fields: tuple[str, ...] = ("U", "p")
) -> Path:
    """processor<i>/<time>/ with `fields` (a time listed for a rank; '!' marks a partial)."""
    (tmp_path / "system").mkdir()
    (tmp_path / "system" / "controlDict").write_text(CONTROL)
    for rank, times in writes.items():
        for t in ["0", *times]:
            d = tmp_path / f"processor{rank}" / t.rstrip("!")
            d.mkdir(parents=True, exist_ok=True)
            for f in fields[:1] if t.endswith("!") else fields:
                (d / f).write_text("x")
    return tmp_path


def test_the_latest_time_every_rank_wrote_completely(tmp_path: Path) -> None:
    c = case(tmp_path, {0: ["50", "100", "150"], 1: ["50", "100", "150!"]})
    assert latest_written_time(c, 2) == "100"


def test_nothing_past_the_start_or_a_missing_rank_is_none(tmp_path: Path) -> None:
    c = case(tmp_path, {0: [], 1: []})
    assert latest_written_time(c, 2) is None
    assert latest_written_time(c, 3) is None  # processor2 is missing


def test_resuming_drops_later_partial_writes_and_starts_from_latest(tmp_path: Path) -> None:
    c = case(tmp_path, {0: ["50", "100", "150"], 1: ["50", "100", "150!"]})
    resume_from(c, "100")
    assert sorted(p.name for p in (c / "processor0").iterdir()) == ["0", "100", "50"]
    assert sorted(p.name for p in (c / "processor1").iterdir()) == ["0", "100", "50"]
    assert "startFrom latestTime;" in (c / "system" / "controlDict").read_text()
    assert latest_written_time(c, 2) == "100"
