"""`rankpack model ...` run in-process (`run_cli`): exit codes, JSON keys, errors, PNGs."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.cli_runner import run_cli

SHAPE = ["--ranks", "16", "--nodes", "12", "--cpus", "8"]
POINTS = ["1:1249", "2:1410", "3:1446", "4:1604", "5:1670"]


def test_fit_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "model", "fit", *SHAPE, *POINTS, "--json")
    assert code == 0
    data = json.loads(out)
    assert round(data["beta"], 3) == 0.524
    assert round(data["beta_stderr"], 3) == 0.021
    assert [p["n"] for p in data["points"]] == [1, 2, 3, 4, 5]
    for p in data["points"]:
        assert {"n", "makespan_s", "throughput", "predicted_throughput", "error_pct"} <= set(p)
    assert data["warnings"] == []
    assert err == ""


def test_fit_calibrate_on_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys, "model", "fit", *SHAPE, *POINTS, "--calibrate-on", "2", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert round(data["beta"], 3) == 0.773
    assert data["beta_stderr"] is None
    assert [round(p["error_pct"], 1) for p in data["points"][2:]] == [8.6, 8.0, 13.4]
    assert len(data["warnings"]) == 1 and "blind" in data["warnings"][0]
    assert err.count("\n") == 1 and err.startswith("rankpack: warning:")


def test_fit_table_and_duty_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run_cli(
        capsys,
        "model", "fit", *SHAPE, *POINTS,
        "--duty-cycles", "8x0.05,4x0.115,4x0.194",
        "--plot-dir", str(tmp_path),
    )  # fmt: skip
    assert code == 0
    assert "0.524" in out and "duty-cycle predictor" in out
    png = tmp_path / "throughput.png"
    assert png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["1:1249"], "at least two points"),
        (["1:1249", "0:100"], "N must be >= 1"),
        (["1:1249", "2:-3"], "positive number of seconds"),
        (["2:1410", "3:1446"], "baseline 1:T1_s"),
        (["1:1249", "2:1410", "--calibrate-on", "4"], "--calibrate-on 4"),
    ],
)
def test_fit_bad_input(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = run_cli(capsys, "model", "fit", *SHAPE, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("rankpack: error:") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_fit_from_db_without_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    code, _, err = run_cli(capsys, "--db", str(db), "model", "fit", *SHAPE, "--from-db")
    assert code == 2 and "no recorded multiplex runs in DB" in err
    assert not db.exists()  # never creates the database
    sqlite3.connect(db).execute("CREATE TABLE runs (id INTEGER)").connection.close()
    code, _, err = run_cli(capsys, "--db", str(db), "model", "fit", *SHAPE, "--from-db")
    # a database rankpack did not make is refused untouched (issue 12), not read
    assert code == 2 and "belongs to another program" in err


def test_predict_warns_beyond_rho_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys, "model", "predict", *SHAPE, "--beta", "0.524", "--t1", "1249",
        "--max-n", "8", "--fitted-max-n", "5", "--duty", "0.12", "--json",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert len(data["rows"]) == 8
    row3 = data["rows"][2]
    assert row3["throughput"] == pytest.approx(3 / (1 + 0.524 / 3))
    assert row3["makespan_s"] == pytest.approx(1249 * (1 + 0.524 / 3))
    assert data["rows"][4]["p_overlap"] == pytest.approx(0.186, abs=0.001)
    assert any("N=7: rho=1.17 > 1" in w for w in data["warnings"])
    assert any("N=6 is beyond the largest N used in the fit" in w for w in data["warnings"])
    assert "rankpack: warning: N=7: rho=1.17 > 1" in err


def test_predict_table_and_duty_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "model", "predict", *SHAPE, "--duty-cycles", "8x0.05,4x0.115,4x0.194"
    )
    assert code == 0 and "duty_model_throughput" in out


def test_predict_needs_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "model", "predict", *SHAPE)
    assert code == 2 and "--beta" in err
    code, _, err = run_cli(capsys, "model", "predict", *SHAPE, "--beta", "-1")
    assert code == 2 and "beta must be" in err
    code, _, err = run_cli(capsys, "model", "predict", *SHAPE, "--beta", "0.5", "--max-n", "0")
    assert code == 2 and "--max-n" in err


def test_high_duty_cycle_warns(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "model", "predict", *SHAPE, "--beta", "1", "--duty", "0.6", "--json"
    )
    assert code == 0
    assert any("50%" in w for w in json.loads(out)["warnings"])


def test_plan_json_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run_cli(
        capsys, "model", "plan", *SHAPE, *POINTS,
        "--weights", "8x1,4x5,4x15", "--quota", "30",
        "--price-per-node-hour", "0.3433", "--plot-dir", str(tmp_path), "--json",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert data["recommended_n"] == 3 and data["knee_n"] == 3
    assert data["max_n_proportional"] == 5 and data["max_n_equal"] == 1
    assert data["rows"][4]["proportional_request_millis"] == 5 * 5868
    assert data["rows"][4]["equal_request_millis"] == 80_000
    # cost from the model makespan T_2 = T_1 (1 + beta/6), not the measured 1410 s
    t2 = 1249 * (1 + data["beta"] / 6)
    assert data["rows"][1]["cost_per_sim"] == pytest.approx(12 * 0.3433 * t2 / 3600 / 2)
    assert (tmp_path / "efficiency.png").stat().st_size > 1000


def test_plan_table_from_beta(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "model", "plan", *SHAPE, "--beta", "0.524", "--t1", "1249")
    assert code == 0 and "recommended N = 3" in out


def test_plan_needs_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "model", "plan", *SHAPE)
    assert code == 2 and "--beta" in err
    code, _, err = run_cli(capsys, "model", "plan", *SHAPE, *POINTS, "--beta", "0.5")
    assert code == 2 and "not both" in err


def test_plan_from_duty_cycles_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "model", "plan", *SHAPE, "--duty-cycles", "8x0.05,4x0.115,4x0.194", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["source"] == "duty-cycle predictor" and data["beta"] is None
    assert data["rows"][0]["throughput"] == pytest.approx(1.0)
    assert data["recommended_n"] == 3


def test_plan_weights_must_match_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "model", "plan", *SHAPE, "--beta", "0.5", "--weights", "1,2")
    assert code == 2 and "one weight per rank" in err


def test_predict_and_fit_report_the_physical_limit(capsys: pytest.CaptureFixture[str]) -> None:
    # FACTS.md: 2 ranks weighted 1:3 (duty 1/3 and 1) on 2 cores: C1 = 4/3 -> 1.5x at most
    shape = ["--ranks", "2", "--nodes", "1", "--cpus", "2", "--duty-cycles", "0.3333333,1"]
    code, out, _ = run_cli(capsys, "model", "predict", *shape, "--max-n", "3", "--json")
    assert code == 0
    limits = [r["throughput_limit"] for r in json.loads(out)["rows"]]
    assert limits == pytest.approx([1.0, 1.5, 1.5], rel=1e-6)
    code, out, _ = run_cli(capsys, "model", "fit", *shape, "1:10", "2:16", "--json")
    assert code == 0
    points = json.loads(out)["duty_cycle_model"]["points"]
    assert [p["throughput_limit"] for p in points][:2] == pytest.approx([1.0, 1.5], rel=1e-6)
    code, out, _ = run_cli(capsys, "model", "fit", *shape, "1:10", "2:16")
    assert code == 0 and "physical limit of the gain" in out and "N=2: 1.50x" in out
