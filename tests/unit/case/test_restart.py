"""The last complete write of a decomposed case, and resuming from it."""

from __future__ import annotations

from pathlib import Path

from rankpack.case.restart import (
    ResumePoint,
    latest_written_time,
    prepare_resume,
    resume_from,
    steps_to,
)
from rankpack.case.staging import StagedCase, StageSpec, stage

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


def _restart_case(
    tmp_path: Path, writes: dict[int, list[str]], fields: tuple[str, ...] = ("U", "p")
) -> Path:
    """processor<i>/<time>/ with `fields` (a time listed for a rank; '!' marks a partial)."""
    (tmp_path / "system").mkdir(parents=True)
    (tmp_path / "system" / "controlDict").write_text(CONTROL)
    for rank, times in writes.items():
        for t in ["0", *times]:
            d = tmp_path / f"processor{rank}" / t.rstrip("!")
            d.mkdir(parents=True, exist_ok=True)
            for f in fields[:1] if t.endswith("!") else fields:
                (d / f).write_text("x")
    return tmp_path


def test_the_latest_time_every_rank_wrote_completely(tmp_path: Path) -> None:
    c = _restart_case(tmp_path, {0: ["50", "100", "150"], 1: ["50", "100", "150!"]})
    assert latest_written_time(c, 2) == "100"


def test_nothing_past_the_start_or_a_missing_rank_is_none(tmp_path: Path) -> None:
    c = _restart_case(tmp_path, {0: [], 1: []})
    assert latest_written_time(c, 2) is None
    assert latest_written_time(c, 3) is None  # processor2 is missing


def test_resuming_drops_later_partial_writes_and_starts_from_latest(tmp_path: Path) -> None:
    c = _restart_case(tmp_path, {0: ["50", "100", "150"], 1: ["50", "100", "150!"]})
    resume_from(c, "100")
    assert sorted(p.name for p in (c / "processor0").iterdir()) == ["0", "100", "50"]
    assert sorted(p.name for p in (c / "processor1").iterdir()) == ["0", "100", "50"]
    assert "startFrom latestTime;" in (c / "system" / "controlDict").read_text()
    assert latest_written_time(c, 2) == "100"


def test_prepare_resume_keeps_the_lost_runs_files_beside(tmp_path: Path) -> None:
    c = _restart_case(tmp_path, {0: ["50", "100", "150"], 1: ["50", "100", "150!"]})
    (c / "log.simpleFoam").write_text("Time = 1\n")
    (c / ".rankpack").mkdir()
    (c / ".rankpack" / "mpirun.exit").write_text("1\n")
    point = prepare_resume(c, 2, "simpleFoam")
    assert point == ResumePoint("100", 100)
    assert (c / "log.simpleFoam.lost-1").read_text() == "Time = 1\n"
    assert not (c / "log.simpleFoam").exists() and not (c / ".rankpack").exists()
    assert (c / ".rankpack.lost-1" / "mpirun.exit").exists()
    assert "startFrom latestTime;" in (c / "system" / "controlDict").read_text()
    # lost a second time: the first run's files stay, the second's go beside them
    (c / "log.simpleFoam").write_text("Time = 101\n")
    assert prepare_resume(c, 2, "simpleFoam") == ResumePoint("100", 100)
    assert (c / "log.simpleFoam.lost-2").read_text() == "Time = 101\n"


def test_prepare_resume_without_a_write_starts_over(tmp_path: Path) -> None:
    c = _restart_case(tmp_path, {0: ["50!"], 1: []})
    assert prepare_resume(c, 2, "simpleFoam") == ResumePoint(None, 0)
    assert sorted(p.name for p in (c / "processor0").iterdir()) == ["0"]


def test_steps_count_from_the_start_time_in_time_steps(tmp_path: Path) -> None:
    c = _restart_case(tmp_path, {0: [], 1: []})
    text = (c / "system" / "controlDict").read_text()
    (c / "system" / "controlDict").write_text(
        text.replace("startTime 0;", "startTime 10;").replace("deltaT 1;", "deltaT 0.5;")
    )
    assert steps_to(c, "60") == 100


def test_staging_a_resume_copies_nothing_and_says_from_where(tmp_path: Path) -> None:
    c = _restart_case(tmp_path / "run", {0: ["50", "100"], 1: ["50", "100"]})
    staged = StagedCase(c, "pitzDaily", "/src", "simpleFoam", (10, 10), 250)
    spec = StageSpec("s2", "pitzDaily", 2, tmp_path / "runs", 250, resume=staged)
    again = stage(spec)
    assert again.run_dir == c and again.expected_iterations == 250
    assert (again.resumed_from, again.start_iterations) == ("100", 100)
    assert not (tmp_path / "runs").exists()  # nothing copied
