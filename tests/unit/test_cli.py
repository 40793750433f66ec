"""The command line as a user meets it: output, JSON keys, and one-line errors (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rankpack.cli import main


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--weights", "1,1,5,15", "--budget", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total_millis"] == 4000
    assert [r["cpu_millis"] for r in data["ranks"]] == [182, 182, 909, 2727]
    assert data["ranks"][0] == {"rank": 0, "weight": 1.0, "cpu_millis": 182, "limit_millis": None}


def test_plan_equal_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--equal", "--ranks", "3", "--budget", "1"]) == 0
    out = capsys.readouterr().out
    assert "334m" in out and "333m" in out and "1000m" in out


def test_plan_grouped_with_floor(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--weights", "8x1,4x5,4x15", "--budget", "16", "--floor", "250m", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    millis = [r["cpu_millis"] for r in data["ranks"]]
    assert sum(millis) == 16000 and min(millis) == 250 and len(millis) == 16


BAD_INPUT = [
    (["plan", "--weights", "1,1,5", "--ranks", "4"], "3 values but --ranks is 4"),
    (["plan", "--weights", "1,-1"], "must be a positive number"),
    (["plan", "--weights", "1,0"], "must be a positive number"),
    (["plan", "--weights", "a,b"], "is not a number"),
    (["plan", "--weights", "1,1", "--budget", "0"], "--budget must be a positive"),
    (["plan", "--weights", "1,1", "--budget", "-2"], "--budget must be a positive"),
    (["plan", "--weights", "1,1", "--budget", "x"], "not a number of cores"),
    (["plan", "--weights", "1,1", "--budget", "0.1", "--floor", "60m"], "too small"),
    (["run", "pitzDaily", "--ranks", "2", "--weights", "1,2,3"], "3 values but --ranks is 2"),
    (["run", "pitzDaily", "--qos", "limits"], "--allow-limits"),
    (["run", "pitzDaily", "--iterations", "0"], "--iterations must be at least 1"),
    (["run", "noSuchTutorial"], "unknown tutorial 'noSuchTutorial'"),
    (["run", "/no/such/dir"], "does not exist"),
    (["run", "pitzDaily", "--ranks", "0"], "--ranks must be at least 1"),
    (["runs", "show", "12345"], "no rankpack database"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUT)
def test_bad_input_one_line_exit_2_nothing_created(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], isolated_home: Path
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    runs = isolated_home / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_not_an_openfoam_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notacase").mkdir()
    assert main(["run", str(tmp_path / "notacase")]) == 2
    assert "not an OpenFOAM case" in capsys.readouterr().err


def test_argparse_errors_are_one_line_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rankpack", "plan", "--nonsense"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unrecognized arguments" in proc.stderr


def test_a_closed_pipe_stops_quietly(tmp_path: Path) -> None:
    """`rankpack ... | head`: the reader has gone before the output is written."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rankpack", "plan", "--weights", "1,2,3", "--json"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == ""


def test_debug_shows_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rankpack", "--debug", "plan", "--weights", "1,0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_runs_list_empty(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("demo", "plan", "run", "runs", "report"):
        assert command in out


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


@pytest.mark.parametrize(("daemon", "out"), [(True, "result"), (False, "resultfinalized\n")])
def test_leave_finalizes_only_without_live_daemon_threads(daemon: bool, out: str) -> None:
    # a daemon thread still blocked (the operator's watch, its Lease elector): the output is
    # flushed, the code kept, and the interpreter is not torn down around the thread (an
    # atexit handler, which finalization would run, does not run); with none, the exit is the
    # ordinary one and the handler runs
    thread = "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    done = _python(
        "import atexit, threading, time\n"
        "from rankpack.cli import leave\n"
        "atexit.register(lambda: print('finalized'))\n"
        + (thread if daemon else "")
        + "print('result', end='')\n"
        "leave(3)\n"
    )
    assert (done.returncode, done.stdout) == (3, out)


def test_the_process_entry_prints_thread_stacks_on_a_fatal_signal() -> None:
    done = _python(
        "import atexit, faulthandler, sys\n"
        "atexit.register(lambda: print('faulthandler', faulthandler.is_enabled()))\n"
        "sys.argv = ['rankpack', '--help']\n"
        "from rankpack.cli import entry\n"
        "entry()\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "faulthandler True"
