"""`rankpack dev-cluster up` as a user who is not root: refused in one line, exit 2.

Runs the CLI as a child process under another uid (setpriv): the integration tier (the
other refusals are tests/unit/devcluster/test_refusals.py). Needs root to drop to nobody,
not a cluster."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_not_root_is_refused() -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) not installed")
    proc = subprocess.run(
        [
            setpriv,
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-m",
            "rankpack",
            "dev-cluster",
            "up",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "must run as root" in err
