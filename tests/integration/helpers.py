"""Helpers for tests that run real OpenFOAM, Open MPI and cgroups on this machine."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rankpack.backend import cgroups
from tests.cli_runner import rankpack


def run_json(*argv: str, timeout: float = 300) -> dict[str, Any]:
    proc = rankpack(*argv, "--json", timeout=timeout)
    assert proc.stdout.strip(), f"no JSON output; stderr: {proc.stderr[-2000:]}"
    data: dict[str, Any] = json.loads(proc.stdout)
    data["_returncode"] = proc.returncode
    return data


def cgroup_subtree() -> Path:
    """rankpack's subtree under the detected driver's root (the cpu hierarchy on v1, the
    unified hierarchy on v2): where the run cgroups ``run-<sim>-<owner pid>`` live."""
    driver = cgroups.detect()
    if isinstance(driver, cgroups.CgroupV1):
        return driver.cpu_root / cgroups.SUBTREE
    assert isinstance(driver, cgroups.CgroupV2), driver
    return driver.root / cgroups.SUBTREE


def run_cgroups(owner_pid: int) -> list[Path]:
    """The run cgroups (``rankpack/run-*-<owner_pid>``) an owner process has, on v1 or v2."""
    subtree = cgroup_subtree()
    if not subtree.is_dir():
        return []
    return [
        p
        for p in subtree.iterdir()
        if p.is_dir() and p.name.startswith("run-") and p.name.endswith(f"-{owner_pid}")
    ]


def processes_in(directory: Path) -> list[int]:
    """Pids whose working directory is inside ``directory`` (the ranks of a run)."""
    found = []
    target = str(directory.resolve())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if cwd == target or cwd.startswith(target + "/"):
            found.append(int(proc.name))
    return found


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
