"""Shared fixtures. Every test gets its own database and run-directory root."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "rankpack-home"
    monkeypatch.setenv("RANKPACK_HOME", str(home))
    monkeypatch.setenv("RANKPACK_DB", str(home / "rankpack.db"))
    return home
