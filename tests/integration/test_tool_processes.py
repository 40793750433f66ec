"""OpenFOAM tools as child processes (case.openfoam.run_tool, `foamtools.run_logged`), with
stand-in programs:
the whole process group is stopped on an interrupt, and a failed tool's log is kept.

Real processes (``sh``, ``sleep``) under a real interval timer: the integration tier."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from rankpack.case.openfoam import run_tool
from rankpack.errors import UserError

pytestmark = pytest.mark.integration


def _processes_in(cwd: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().split(") ", 1)[1].split()[0]
            if state != "Z" and os.readlink(entry / "cwd") == str(cwd):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_interrupt_stops_the_tool_and_its_children(tmp_path: Path) -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            # a tool that starts a grandchild and ignores nothing: both must go
            run_tool(tmp_path, ["sh", "-c", "sleep 60 & sleep 60; wait"], "fake")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    deadline = time.monotonic() + 10
    while _processes_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_in(tmp_path) == []
    assert time.monotonic() - t0 < 20


def test_a_tool_that_ignores_sigterm_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankpack.case import foamtools

    monkeypatch.setattr(foamtools, "STOP_GRACE_S", 0.5)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_tool(tmp_path, ["sh", "-c", "trap '' TERM; sleep 60 & sleep 60; wait"], "stubborn")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    deadline = time.monotonic() + 10
    while _processes_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_in(tmp_path) == []


def test_failed_tool_log_is_kept_where_the_message_points(
    tmp_path: Path, isolated_home: Path
) -> None:
    case = tmp_path / "staging"
    case.mkdir()
    script = "echo '--> FOAM FATAL ERROR:'; echo 'cannot find vertices'; exit 1"
    with pytest.raises(UserError) as info:
        run_tool(case, ["sh", "-c", script], "blockMesh")
    message = str(info.value)
    assert "cannot find vertices" in message
    kept = Path(message.rsplit("see ", 1)[1])
    import shutil

    shutil.rmtree(case)  # what a failed run does with its staging directory
    assert kept.is_file() and kept.is_relative_to(isolated_home / "logs")
    assert "FOAM FATAL" in kept.read_text()
