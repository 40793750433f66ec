"""deploy/monitoring's rules pass Prometheus's own checker and each alert fires in its test
case (``promtool check rules``, ``promtool test rules``; promtool from Debian's prometheus
package, unpacked and cached by tests/monitoring/install_promtool.sh)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def promtool() -> str:
    done = subprocess.run(["sh", str(REPO / "tests/monitoring/install_promtool.sh")],
                          capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    return done.stdout.strip()


def test_the_rules_pass_promtool_check(promtool: str) -> None:
    done = subprocess.run([promtool, "check", "rules", "deploy/monitoring/rules.yaml"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 6 rules found" in done.stdout


def test_each_alert_fires_in_its_promtool_case(promtool: str) -> None:
    done = subprocess.run([promtool, "test", "rules", "rules_test.yaml"],
                          cwd=REPO / "tests/monitoring", capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
