"""Resuming a decomposed case from the last time it wrote (after a lost node).

A decomposed run writes each rank's fields to ``processor<i>/<time>/``; after a crash the
latest time every processor directory holds, with every field file the first processor
writes there, is the last complete write. The run restarts from it (``startFrom
latestTime``), with the same decomposition, and nothing past it is run twice: what ran
after it is lost, and reported: `prepare_resume` says from which time and after how many
time steps it starts again. Called when a simulation a lost node stopped is staged again
(`staging.resume`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rankpack.errors import UserError

_PROCESSOR = re.compile(r"^processor([0-9]+)$")


def _times(directory: Path) -> dict[float, str]:
    """Time directories of `directory` (their names as numbers -> names)."""
    out: dict[float, str] = {}
    try:
        entries = list(directory.iterdir())
    except OSError:
        return out
    for entry in entries:
        try:
            value = float(entry.name)
        except ValueError:
            continue
        if entry.is_dir() and not entry.is_symlink():
            out[value] = entry.name
    return out


def _complete(time_dir: Path, fields: set[str]) -> bool:
    try:
        return fields <= {p.name for p in time_dir.iterdir() if p.is_file()}
    except OSError:
        return False


def latest_written_time(case_dir: Path, n_ranks: int) -> str | None:
    """The latest time written completely by every one of ``n_ranks`` processor
    directories, later than the start (None: nothing beyond the start was written)."""
    procs = [case_dir / f"processor{i}" for i in range(n_ranks)]
    if not all(p.is_dir() for p in procs):
        return None
    common: set[float] | None = None
    per_proc = [_times(p) for p in procs]
    for times in per_proc:
        common = set(times) if common is None else common & set(times)
    if not common:
        return None
    _start, *later = sorted(common)
    for value in sorted(later, reverse=True):
        name = per_proc[0][value]
        fields = {p.name for p in (procs[0] / name).iterdir() if p.is_file()}
        if fields and all(
            _complete(p / per[value], fields) for p, per in zip(procs, per_proc, strict=True)
        ):
            return name
    return None


def resume_from(case_dir: Path, time_name: str) -> None:
    """Restart the case at `time_name`: ``startFrom latestTime`` after removing every
    processor time directory later than it (a partial write the crash cut short)."""
    try:
        value = float(time_name)
    except ValueError:
        raise UserError(f"'{time_name}' is not a time") from None
    for proc in case_dir.glob("processor*"):
        if not _PROCESSOR.match(proc.name):
            continue
        for later_value, name in _times(proc).items():
            if later_value > value:
                _remove_tree(proc / name)
    from foamlib import FoamFile  # (lazy: ~0.15 s to import)

    cd = FoamFile(case_dir / "system" / "controlDict")
    with cd:
        cd["startFrom"] = "latestTime"


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class ResumePoint:
    time: str | None
    """The time directory it starts from (None: nothing was written; from its start)."""
    steps: int
    """Time steps from the case's start time to it (what the run had done and kept)."""


def steps_to(case_dir: Path, time_name: str) -> int:
    """Time steps from the case's ``startTime`` to ``time_name`` (``deltaT`` apart)."""
    from foamlib import FoamFile  # (lazy: ~0.15 s to import)

    cd = FoamFile(case_dir / "system" / "controlDict")
    start = float(cd.get("startTime", 0))  # type: ignore[arg-type]
    delta = float(cd["deltaT"])  # type: ignore[arg-type]
    return max(0, round((float(time_name) - start) / delta)) if delta > 0 else 0


def prepare_resume(case_dir: Path, n_ranks: int, solver: str) -> ResumePoint:
    """Make a decomposed case cut short run again from its last complete write: later
    partial writes removed, ``startFrom latestTime``; the solver's log and the backend's
    launch files (``.rankpack``) of the run cut short are kept beside, renamed
    ``<name>.lost-<k>``, so the run starts with files of its own and nothing is lost."""
    latest = latest_written_time(case_dir, n_ranks)
    for name in (f"log.{solver}", ".rankpack"):
        path = case_dir / name
        if path.exists():
            k = 1
            while (case_dir / f"{name}.lost-{k}").exists():
                k += 1
            path.rename(case_dir / f"{name}.lost-{k}")
    if latest is None:
        from foamlib import FoamFile  # (lazy: ~0.15 s to import)

        start = FoamFile(case_dir / "system" / "controlDict").get("startTime", 0)
        resume_from(case_dir, str(start))
        return ResumePoint(None, 0)
    resume_from(case_dir, latest)
    return ResumePoint(latest, steps_to(case_dir, latest))
