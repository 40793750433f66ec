"""Fault injection on real OpenFOAM (issue 12): signals in the middle of `decompose` and
`demo`, a failing mesher, a missing solver.

What is asserted after each fault: the exit code (130 for SIGINT/SIGTERM), no half-made
output (no --output directory, a decomposed case exactly as before), no orphaned
blockMesh/decomposePar, the installed tutorial untouched, and after a SIGKILL that the
next invocation removes what the killed one left (hidden, pid-named staging).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rankpack.case.openfoam import copy_case, ensure_mesh, find_tutorial, resolve_case

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("blockMesh") is None or shutil.which("decomposePar") is None,
        reason="OpenFOAM is not installed",
    ),
]

TOOLS = ("blockMesh", "decomposePar")


def _start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rankpack", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _tools_under(root: Path, *, any_name: bool = False) -> list[int]:
    """Pids of blockMesh/decomposePar processes (with ``any_name``: of any process) that
    are not zombies and work under ``root``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            state = (entry / "stat").read_text().split(") ", 1)[1].split()[0]
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if (any_name or comm in TOOLS) and state != "Z" and cwd.startswith(str(root)):
            found.append(int(entry.name))
    return found


def _wait_for_phase(
    what: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 180
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            pytest.fail(f"rankpack ended (exit {proc.returncode}) before the fault: {err}")
        time.sleep(0.02)
    proc.kill()
    pytest.fail("the phase to interrupt never started")


def _tool_running(name: str, root: Path) -> Callable[[], bool]:
    def check() -> bool:
        for pid in _tools_under(root):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                    return True
            except OSError:
                continue
        return False

    return check


def _no_orphans(root: Path, sig: signal.Signals) -> None:
    """No tool still works under ``root``. After SIGINT/SIGTERM rankpack stopped the tool's
    whole process group before exiting: nothing at all may be left, at once. After SIGKILL
    the kernel's parent-death signal stops the tool itself (not children it may have
    started; OpenFOAM's tools start none), which takes a moment."""
    killed = sig == signal.SIGKILL
    deadline = time.monotonic() + (20 if killed else 1)
    while _tools_under(root, any_name=not killed) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _tools_under(root, any_name=not killed) == [], "OpenFOAM tools outlived rankpack"


@pytest.fixture
def slow_tools(tmp_path: Path) -> dict[str, str]:
    """PATH with blockMesh/decomposePar wrappers that wait 3 s before exec'ing the real
    tool (a window wide enough to hit on a loaded machine) and meanwhile keep a background
    child, which an interrupt must stop too (only the whole process group reaches it)."""
    bin_dir = tmp_path / "slow-bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        real = shutil.which(tool)
        assert real is not None
        wrapper = bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\nsleep 30 &\nbg=$!\nsleep 3\nkill $bg\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _listing(root: Path) -> dict[str, tuple[int, float]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def tutorial_listing() -> tuple[Path, dict[str, tuple[int, float]]]:
    src = find_tutorial("pitzDaily")
    return src, _listing(src)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=str)
@pytest.mark.parametrize("phase", TOOLS)
def test_decompose_tutorial_interrupted_leaves_nothing(
    tmp_path: Path,
    sig: signal.Signals,
    phase: str,
    tutorial_listing: tuple[Path, dict[str, tuple[int, float]]],
    slow_tools: dict[str, str],
) -> None:
    parent = tmp_path / "out"
    parent.mkdir()
    out = parent / "pd"
    argv = ["decompose", "pitzDaily", "--output", str(out), "--weights", "1,1,5,15"]
    proc = _start(argv, env=slow_tools)
    _wait_for_phase(_tool_running(phase, parent), proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 130, err
        assert err == "rankpack: interrupted\n"
    _no_orphans(parent, sig)
    assert not out.exists()
    left = sorted(p.name for p in parent.iterdir())
    if sig != signal.SIGKILL:
        assert left == []
    else:  # only a hidden staging copy named with the dead pid; the next run removes it
        assert all(n.startswith(".pd.rankpack-tmp-") for n in left), left
        again = _start(["decompose", "pitzDaily", "--output", str(parent / "pd2"), "--ranks", "2"])
        _, err2 = again.communicate(timeout=300)
        assert again.returncode == 0, err2
        assert sorted(p.name for p in parent.iterdir()) == ["pd2"]
    src, before = tutorial_listing
    assert _listing(src) == before, "the installed tutorial was modified"


@pytest.fixture
def decomposed(tmp_path: Path) -> Path:
    case = tmp_path / "pitz"
    copy_case(resolve_case(str(find_tutorial("pitzDaily"))), case)
    ensure_mesh(case)
    proc = _start(["decompose", str(case), "--weights", "1,3"])
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return case


def _case_state(case: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for rel in ("system/decomposeParDict", "constant/cellDecomposition", "log.decomposePar"):
        p = case / rel
        out[rel] = p.read_bytes() if p.exists() else None
    for proc in sorted(case.glob("processor*")):
        out[proc.name] = sorted(
            (str(p.relative_to(case)), p.stat().st_size) for p in proc.rglob("*")
        )
    out["entries"] = sorted(p.name for p in case.iterdir())
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=str)
def test_decompose_in_place_interrupted_keeps_old_decomposition(
    decomposed: Path, sig: signal.Signals, slow_tools: dict[str, str]
) -> None:
    before = _case_state(decomposed)
    assert before["processor1"] and "processor2" not in before
    proc = _start(["decompose", str(decomposed), "--weights", "1,1,5,15"], env=slow_tools)
    _wait_for_phase(_tool_running("decomposePar", decomposed), proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 130), err
    _no_orphans(decomposed, sig)
    after = _case_state(decomposed)
    if sig == signal.SIGKILL:
        hidden = [n for n in after.pop("entries") if n.startswith(".rankpack-decompose-")]  # type: ignore[attr-defined]
        assert len(hidden) == 1
        before.pop("entries")
        assert after == before
        again = _start(["decompose", str(decomposed), "--weights", "1,2"])
        _, err2 = again.communicate(timeout=300)
        assert again.returncode == 0, err2
        assert not any(p.name.startswith(".rankpack") for p in decomposed.iterdir())
        assert sorted(p.name for p in decomposed.glob("processor*")) == [
            "processor0",
            "processor1",
        ]
    else:
        assert after == before


def test_mesh_failure_message_points_at_a_log_that_exists(tmp_path: Path) -> None:
    case = tmp_path / "broken"
    copy_case(resolve_case(str(find_tutorial("pitzDaily"))), case)
    bmd = case / "system" / "blockMeshDict"
    bmd.write_text(bmd.read_text().replace("vertices", "vertexes", 1))
    home = tmp_path / "home"
    proc = _start(
        ["run", str(case), "--ranks", "2", "--iterations", "2"],
        env={"RANKPACK_HOME": str(home), "RANKPACK_DB": str(home / "db.sqlite")},
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "blockMesh failed" in err
    log = Path(err.rsplit("see ", 1)[1].strip())
    assert log.is_file(), f"the message points at {log}, which does not exist"
    assert "FOAM FATAL" in log.read_text(errors="replace")
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_missing_solver_is_reported_before_copying(tmp_path: Path) -> None:
    case = tmp_path / "nosolver"
    copy_case(resolve_case(str(find_tutorial("pitzDaily"))), case)
    cd = case / "system" / "controlDict"
    cd.write_text(cd.read_text().replace("simpleFoam", "simpelFoam"))
    home = tmp_path / "home"
    t0 = time.monotonic()
    proc = _start(
        ["run", str(case), "--ranks", "2"],
        env={"RANKPACK_HOME": str(home), "RANKPACK_DB": str(home / "db.sqlite")},
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2
    assert err.count("\n") == 1 and "'simpelFoam'" in err and "not an installed" in err
    assert "Primary job" not in err
    assert not home.exists(), "something was created before the solver check"
    assert not (case / "constant" / "polyMesh").exists(), "the case was meshed"
    assert time.monotonic() - t0 < 120


def test_demo_sigterm_exits_130_and_says_the_story_is_incomplete(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"RANKPACK_HOME": str(home), "RANKPACK_DB": str(home / "db.sqlite")}
    proc = _start(["demo", "--quick", "--json"], env=env)
    db = home / "db.sqlite"

    def second_run_running() -> bool:
        # A run exists once its row does: a run directory appears (empty, reserved) when its
        # copy starts being staged, and a signal then interrupts a copy, not a run. The
        # quick demo's second run lasts ~2 s: the signal goes at once, while it is running.
        if not db.is_file():
            return False
        try:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
                n, running = con.execute(
                    "SELECT count(*), count(*) FILTER (WHERE status = 'running') FROM runs"
                ).fetchone()
        except sqlite3.OperationalError:  # not created yet, or locked for a moment
            return False
        return int(n) >= 2 and int(running) >= 1

    _wait_for_phase(second_run_running, proc, timeout=600)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "demo interrupted" in err and "incomplete" in err
    story = json.loads(out)
    assert story["interrupted"] is True
    assert story["summary"]["headline"].startswith("The demo was interrupted")
    assert "payoff" not in story
    listed = subprocess.run(
        [sys.executable, "-m", "rankpack", "runs", "list", "--json"],
        env={**os.environ, **env}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    statuses = json.loads(listed.stdout)
    assert "interrupted" in [r["status"] for r in statuses], statuses  # recorded as such
