"""The unit tier: pure Python, in one process, a few seconds a test at most.

Two guards keep it so:

- a short per-test timeout (`UNIT_TIMEOUT_S`, 10 s; pytest-timeout) on every test under
  tests/unit, as a hang guard: a unit test that waits on something that never comes fails
  in seconds instead of holding the suite for the global 600 s;
- no real processes: starting one (subprocess, fork, posix_spawn, os.system) raises
  `RealProcessInUnitTest` and fails the test. Tests that need mpirun, OpenFOAM, a shell or
  the rankpack CLI as a child process belong in tests/integration.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# matplotlib builds its font cache when first imported, running `fc-list` (a process,
# seconds long) if there is none yet: done here, once, before any test's guard and timeout.
import matplotlib.font_manager  # noqa: F401
import pytest

UNIT_TIMEOUT_S = float(os.environ.get("RANKPACK_UNIT_TIMEOUT_S", "10"))
"""Per-test limit under tests/unit. The slowest unit tests take about 2 s on 2 cores alone,
4.5 s with the machine loaded 3-4 deep by other work; 10 s leaves that room and still
stops a hang at once. ``RANKPACK_UNIT_TIMEOUT_S`` changes it (``0``: no limit)."""

_HERE = Path(__file__).parent
_CALL_FAILED = pytest.StashKey[bool]()
_MOVE = "a unit test started a real process; such a test belongs in tests/integration"


class RealProcessInUnitTest(BaseException):
    """A unit test started a process. A BaseException, so that the code under test does
    not swallow it in an ``except Exception``; the fixture also fails the test afterwards
    if the test itself passed (the attempt was made in a thread, or swallowed)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(_HERE):
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


@pytest.fixture(autouse=True)
def no_real_processes(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[None]:
    started: list[str] = []

    def refuse(name: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            # Popen._execute_child(self, args, ...): the command line is the second
            what = f"{name} {args[1]!r}" if name == "subprocess" else name
            started.append(what)
            raise RealProcessInUnitTest(f"{what}: {_MOVE}")

        return refused

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("subprocess"))
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuse("_posixsubprocess.fork_exec"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        monkeypatch.setattr(os, name, refuse(f"os.{name}"))
    yield
    if started and not request.node.stash.get(_CALL_FAILED, False):
        # raised where the test did not see it (a thread, a swallowed BaseException)
        pytest.fail(f"{', '.join(started)}: {_MOVE}")
