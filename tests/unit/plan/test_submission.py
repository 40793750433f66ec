from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankpack.cli import main
from rankpack.cli.common import phases_from_text
from rankpack.errors import UserError
from rankpack.operator import crd
from rankpack.plan.submission import InvalidSpec, Phase, Submission, validate


def test_phases_parse() -> None:
    phases = phases_from_text("0:500,500,1200,1800; 0.34:1000,1000,1000,1000", 4)
    assert phases == (Phase(0.0, (500, 500, 1200, 1800)), Phase(0.34, (1000,) * 4))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("0:1,2,3", "3 requests for 4 ranks"),
        ("1.2:1,1,1,1", "must be in"),
        ("0.5:1,1,1,1;0.2:1,1,1,1", "increasing order"),
        ("abc", "must look like"),
        ("0:0,1,1,1", "below 1 millicore"),
        ("", "empty"),
    ],
)
def test_bad_phases(text: str, match: str) -> None:
    with pytest.raises(UserError, match=match):
        phases_from_text(text, 4)


def test_submission_round_trip_and_initial_requests() -> None:
    sub = Submission("pitzDaily", (1.0, 1.0, 5.0, 15.0), 4000, iterations=50)
    again = Submission.from_json(json.loads(json.dumps(sub.to_json())))
    assert again == sub
    assert sub.initial_millis == (182, 182, 909, 2727)
    scheduled = Submission(
        "pitzDaily", (1.0,) * 4, 4000, phases=(Phase(0.0, (500, 500, 1200, 1800)),)
    )
    assert scheduled.initial_millis == (500, 500, 1200, 1800)


def test_submit_and_queue_cli(capsys: pytest.CaptureFixture[str], isolated_home: Path) -> None:
    argv = ["submit", "pitzDaily", "--ranks", "2", "--budget", "0.5", "--count", "2", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["queued"] == [1, 2]
    assert main(["queue", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in rows] == ["queued", "queued"]
    assert rows[0]["options"]["budget_millis"] == 500


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["submit", "noSuchCase"], "unknown tutorial"),
        (["submit", "pitzDaily", "--count", "0"], "--count must be at least 1"),
        (["submit", "pitzDaily", "--ranks", "4", "--phases", "0:1,1"], "2 requests for 4 ranks"),
        (["submit", "pitzDaily", "--iterations", "-3"], "--iterations must be at least 1"),
        (["submit", "pitzDaily", "--weights", "1,2"], "2 values but --ranks is 4"),
    ],
)
def test_submit_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], isolated_home: Path
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (isolated_home / "rankpack.db").exists()


OK = Submission("pitzDaily", (1.0, 1.0), 1000)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (Submission("", (1.0,), 1000), "{case} is required"),
        (Submission("c", (), 1000), "{ranks} must be 1..4096, got 0"),
        (Submission("c", (0.0, 0.0), 1000), "not all 0"),
        (Submission("c", (1.0,) * 4, 2), "every rank needs a request of at least 1m"),
        (Submission("c", (1.0, 1.0), 1000, iterations=0), "{iterations} must be at least 1"),
        (Submission("c", (1.0, 1.0), 1000, decompose="x"), "{decompose} must be one of"),
        (Submission("c", (1.0, 1.0), 1000, phases=(Phase(0, (1,)),)), "needs 2 values"),
        (Submission("c", (1.0, 1.0), 1000, phases=(Phase(0.5, (1, 1)), Phase(0.2, (1, 1)))),
         "increasing order"),
        (Submission("c", (1.0, 1.0), 1000, solver="/bin/sh -c x"), "{solver} must be"),
        (Submission("c", (1.0, 1.0), 1000, wait="busy"), "{wait} must be one of auto"),
        (Submission("c", (1.0, 1.0), 1000, qos="burst"), "{qos} must be one of"),
    ],
)  # fmt: skip
def test_validate_names_the_first_bad_field(bad: Submission, message: str) -> None:
    assert validate(OK) is OK
    with pytest.raises(InvalidSpec) as info:
        validate(bad)
    assert message in info.value.template
    assert info.value.code == "InvalidSpec"


def test_run_submit_and_the_crd_refuse_the_same_submission(
    capsys: pytest.CaptureFixture[str], isolated_home: Path
) -> None:
    """One validation: a budget that leaves a rank without CPU is refused by all three."""
    for command in ("run", "submit"):
        assert main([command, "pitzDaily", "--ranks", "4", "--budget", "0.002"]) == 2
        assert "--budget 2m gives rank" in capsys.readouterr().err
    spec = {"case": {"path": "pitzDaily"}, "ranks": 4, "budgetMillis": 2}
    with pytest.raises(UserError, match=r"spec\.budgetMillis 2m gives rank"):
        crd.submission_of({"metadata": {"name": "s"}, "spec": spec})
    assert not (isolated_home / "rankpack.db").exists()
