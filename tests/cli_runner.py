"""The one way tests run the `rankpack` command line, in every tier.

- `run_cli`: in this process, through `rankpack.cli.main`, with pytest's captured output
  (the unit tier: no child process may start there, see tests/unit/conftest.py);
- `rankpack`: as a child process (``python -m rankpack``), as a user runs it (the
  integration and k8s tiers).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import NamedTuple

import pytest

from rankpack.cli import main


class CliResult(NamedTuple):
    """What one in-process command gave: its exit code and what it wrote."""

    code: int
    out: str
    err: str


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> CliResult:
    """Run ``rankpack ARGV...`` in this process; return its exit code, stdout and stderr
    (what was captured since the test's last ``capsys.readouterr()``, which this one ends)."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


def rankpack(
    *argv: str, timeout: float = 300, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m rankpack ARGV...`` as a child process with this interpreter and wait
    at most ``timeout`` seconds; output is captured, a failure is not raised (check
    ``returncode``). ``env``: the child's whole environment (default: this process's)."""
    return subprocess.run(
        [sys.executable, "-m", "rankpack", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else dict(env),
        check=False,
    )
