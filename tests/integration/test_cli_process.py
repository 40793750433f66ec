"""The rankpack process as a user's shell starts it: exit codes and stderr of
``python -m rankpack``, a closed stdout pipe, the process entry's fatal-signal handler and
``leave``'s exit without finalization. Real child processes: the integration tier (the
in-process command line is tests/unit/cli/test_cli.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


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
