"""Shared fixtures. Every test gets its own database and run-directory root."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

# A suite started in the background by a non-interactive shell (`nohup bash -c '...' &`)
# inherits SIGINT ignored, and so would every rankpack process the tests start: the tests
# that press Ctrl-C (SIGINT -> exit 130) would see nothing happen. Ctrl-C is what they
# test, so its default is restored here; exec'd children then start with it too.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "rankpack-home"
    monkeypatch.setenv("RANKPACK_HOME", str(home))
    monkeypatch.setenv("RANKPACK_DB", str(home / "rankpack.db"))
    return home
