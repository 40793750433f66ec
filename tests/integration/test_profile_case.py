"""Duty cycles of real OpenFOAM runs: stored with `rankpack run`, reported by
`rankpack profile CASE` and `rankpack profile --attach`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_runner import rankpack
from tests.integration.helpers import run_json, wait_for

pytestmark = pytest.mark.integration


def test_run_stores_duty_cycles_ordered_by_subdomain_size() -> None:
    # equal CPU, subdomains 556/556/2778/8335 cells: the big rank computes most of the time
    data = run_json(
        "run", "pitzDaily", "--ranks", "4", "--decompose", "weighted",
        "--decompose-weights", "1,1,5,15", "--iterations", "150",
    )  # fmt: skip
    assert data["status"] == "completed", data
    cells = [r["cells"] for r in data["ranks"]]
    assert cells == [556, 556, 2778, 8335]
    assert [r["cpu_millis"] for r in data["ranks"]] == [1000] * 4
    duty = [r["duty"] for r in data["ranks"]]
    assert all(d is not None and 0 < d < 1 for d in duty), duty
    # rank 0 also does the master's work (the log, reading and writing the case), which
    # does not scale with its cells: a CI run measured it at twice rank 1's duty and level
    # with rank 2's; the ranks without it are ordered by their cells, the big one above all
    assert duty[3] > max(duty[0], duty[1], duty[2]), duty
    assert duty[2] > duty[1], duty
    shown = run_json("runs", "show", str(data["id"]))
    assert [r["duty"] for r in shown["ranks"]] == pytest.approx(duty)


def test_profile_case_json_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "duty.png"
    data = run_json(
        "profile", "pitzDaily", "--ranks", "4", "--weights", "1,1,5,15", "--budget", "2",
        "--iterations", "60", "--plot", str(png),
    )  # fmt: skip
    assert data["status"] == "completed" and data["iterations"] == 60
    ranks = data["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    for r in ranks:
        assert 0 <= r["duty"] <= 1
        assert r["compute_s"] > 0 and r["mpi_s"] > 0
        # seed 001 eq. 3: c = r (1 - d)
        assert r["reclaimable_millis"] == pytest.approx(
            r["request_millis"] * (1 - r["duty"]), abs=1
        )
    # 2000m over 1,1,5,15 by largest remainder (sums to 2000 exactly)
    assert [r["request_millis"] for r in ranks] == [91, 91, 454, 1364]
    assert data["reclaimable_millis_total"] == pytest.approx(
        sum(r["reclaimable_millis"] for r in ranks), abs=1
    )
    assert png.stat().st_size > 5_000


def test_profile_attaches_to_a_running_run(isolated_home: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankpack", "run", "pitzDaily", "--iterations", "5000", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: any((isolated_home / "runs").glob("*/.rankpack/shim/rank-3*")), 90,
                 "the shim's live records")  # fmt: skip
        listed = json.loads(rankpack("runs", "list", "--json").stdout)
        run_id = listed[0]["id"]
        data = run_json("profile", "--attach", str(run_id), "--seconds", "3")
        assert data["run_id"] == run_id
        assert len(data["ranks"]) == 4
        assert all(r["duty"] is not None for r in data["ranks"])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finished = rankpack("profile", "--attach", str(run_id), "--seconds", "1")
    assert finished.returncode == 2 and "not running" in finished.stderr
