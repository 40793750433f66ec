"""What ``mpirun --version`` says (`rankpack.backend.mpirun.version_of`) and the Open MPI
major version read from it (`mpirunargs.openmpi_major`): this machine's mpirun (Debian 12:
Open MPI 4.1, MPICH's hydra) and stand-in scripts for a chatty or a silent one. Real
processes, a second in all: the integration tier. (Open MPI 5's own mpirun is run by
tests/integration/test_test_images.py.)"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from rankpack.backend import mpirun as mpirun_module
from rankpack.backend.kubernetes.starting.mpirunargs import openmpi_major
from rankpack.backend.mpirun import VERSION_MAX, version_of

pytestmark = pytest.mark.integration


def _program(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_this_machines_open_mpi_is_4_and_hydra_is_none() -> None:
    for name, major in (("mpirun.openmpi", 4), ("mpiexec.hydra", None)):
        found = shutil.which(name)
        assert found is not None, f"{name} is not installed (bash setup.sh test installs it)"
        assert openmpi_major(version_of(found)) == major, version_of(found)


def test_version_of_says_what_mpirun_says_once_per_path(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    mpirun = _program(tmp_path, "mpirun", f'echo "$@" >> {calls}; echo "mpirun (Open MPI) 5.0.7"')
    assert version_of(mpirun) == "mpirun (Open MPI) 5.0.7\n"
    assert version_of(mpirun) == "mpirun (Open MPI) 5.0.7\n"
    assert calls.read_text() == "--version\n"  # asked once
    assert version_of(str(tmp_path / "absent")) == ""


def test_version_of_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chatty = _program(tmp_path, "chatty", "yes 'mpirun (Open MPI) 5.0.7'")
    assert len(version_of(chatty)) == VERSION_MAX
    monkeypatch.setattr(mpirun_module, "VERSION_TIMEOUT_S", 0.5)
    silent = _program(tmp_path, "silent", "exec sleep 30")
    started = time.monotonic()
    assert version_of(silent) == ""
    assert time.monotonic() - started < 5  # stopped at the timeout, not waited for
