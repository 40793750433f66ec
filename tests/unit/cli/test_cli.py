"""The command line as a user meets it: output, JSON keys, and one-line errors (exit 2)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rankpack.cli import main
from rankpack.errors import UserError


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--weights", "1,1,5,15", "--budget", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total_millis"] == 4000
    assert [r["cpu_millis"] for r in data["ranks"]] == [182, 182, 909, 2727]
    assert data["ranks"][0] == {"rank": 0, "weight": 1.0, "cpu_millis": 182, "limit_millis": None}


def test_plan_equal_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--equal", "--ranks", "3", "--budget", "1"]) == 0
    out = capsys.readouterr().out
    assert "334m" in out and "333m" in out and "1000m" in out


def test_plan_grouped_with_floor(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--weights", "8x1,4x5,4x15", "--budget", "16", "--floor", "250m", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    millis = [r["cpu_millis"] for r in data["ranks"]]
    assert sum(millis) == 16000 and min(millis) == 250 and len(millis) == 16


BAD_INPUT = [
    (["plan", "--weights", "1,1,5", "--ranks", "4"], "3 values but --ranks is 4"),
    (["plan", "--weights", "1,-1"], "must be a positive number"),
    (["plan", "--weights", "1,0"], "must be a positive number"),
    (["plan", "--weights", "a,b"], "is not a number"),
    (["plan", "--weights", "1,1", "--budget", "0"], "--budget must be a positive"),
    (["plan", "--weights", "1,1", "--budget", "-2"], "--budget must be a positive"),
    (["plan", "--weights", "1,1", "--budget", "x"], "not a number of cores"),
    (["plan", "--weights", "1,1", "--budget", "0.1", "--floor", "60m"], "too small"),
    (["run", "pitzDaily", "--ranks", "2", "--weights", "1,2,3"], "3 values but --ranks is 2"),
    (["run", "pitzDaily", "--qos", "limits"], "--allow-limits"),
    (["run", "pitzDaily", "--iterations", "0"], "--iterations must be at least 1"),
    (["run", "noSuchTutorial"], "unknown tutorial 'noSuchTutorial'"),
    (["run", "/no/such/dir"], "does not exist"),
    (["run", "pitzDaily", "--ranks", "0"], "--ranks must be at least 1"),
    (["runs", "show", "12345"], "no rankpack database"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUT)
def test_bad_input_one_line_exit_2_nothing_created(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], isolated_home: Path
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    runs = isolated_home / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_not_an_openfoam_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notacase").mkdir()
    assert main(["run", str(tmp_path / "notacase")]) == 2
    assert "not an OpenFOAM case" in capsys.readouterr().err


def test_runs_list_empty(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("demo", "plan", "run", "runs", "report"):
        assert command in out


def test_each_command_is_registered_by_the_module_the_lazy_table_names() -> None:
    """`rankpack.cli.COMMANDS` = what the modules register (a command line that names a
    command imports only its module)."""
    import argparse
    import importlib

    from rankpack.cli import COMMAND_MODULES, COMMANDS

    registered: dict[str, str] = {}
    for name in COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(name).register(sub)
        registered.update(dict.fromkeys(sub.choices, name))
    assert registered == COMMANDS


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["node-agent", "--port", "1"], "node-agent"),
        (["--debug", "--db", "/tmp/x.db", "runs", "--json"], "runs"),
        (["--db=/tmp/x.db", "operator"], "operator"),
        (["--help"], None),
        ([], None),
    ],
)
def test_the_named_command(argv: list[str], command: str | None) -> None:
    from rankpack.cli import named_command

    assert named_command(argv) == command


def test_a_named_command_gets_only_its_own_parser_and_the_rest_all() -> None:
    from rankpack.cli import build_parser

    def commands(argv: list[str] | None) -> set[str]:
        parser = build_parser(argv)
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return set(sub.choices)

    assert commands(["simulations", "--json"]) == {"operator", "simulations"}
    everything = commands(None)
    assert {"run", "node-agent", "dev-cluster"} <= everything
    assert commands(["no-such-command"]) == everything


def test_run_takes_the_mpi_and_its_transport() -> None:
    from rankpack.cli import build_parser

    parser = build_parser(["run"])
    args = parser.parse_args(["run", "pitzDaily", "--backend", "kubernetes", "--mpi", "mpich",
                              "--mpi-transport", "tcp"])  # fmt: skip
    assert (args.mpi, args.mpi_transport) == ("mpich", "tcp")
    defaults = parser.parse_args(["run", "pitzDaily"])
    # shared memory within a rank group's pod, TCP between pods (decision 0012)
    assert (defaults.mpi, defaults.mpi_transport) == ("openmpi", "auto")
    operator = build_parser(["operator"])
    assert operator.parse_args(["operator"]).mpi_transport == "auto"
    assert operator.parse_args(["operator", "--mpi-transport", "tcp"]).mpi_transport == "tcp"
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "pitzDaily", "--mpi", "intelmpi"])


def test_the_mpi_transport_is_parsed_once() -> None:
    from rankpack.backend.kubernetes.api.config import KubernetesConfig, parse_transport

    assert parse_transport("tcp") == "tcp" and parse_transport("auto") == "auto"
    with pytest.raises(UserError, match="shm"):
        parse_transport("shm")
    with pytest.raises(UserError, match="transport"):
        KubernetesConfig(mpi_transport="shm")  # type: ignore[arg-type]
    assert KubernetesConfig().mpi_transport == "auto"


def test_a_simulations_mpi_is_data_checked_once() -> None:
    from rankpack.operator.crd import crd_manifest, spec_of, submission_of
    from rankpack.plan.submission import MPIS, Submission
    from rankpack.profile.shim import FLAVOURS

    assert MPIS == FLAVOURS  # the shim is built for each MPI a simulation may name
    sub = Submission(case="pitzDaily", weights=(1, 1), budget_millis=1600, mpi="mpich")
    assert submission_of({"metadata": {"name": "s"}, "spec": spec_of(sub)}) == sub
    assert Submission.from_json(sub.to_json()) == sub
    assert Submission.from_json({**sub.to_json(), "mpi": None}).mpi is None
    bad = {"case": {"path": "pitzDaily"}, "ranks": 2, "mpi": "intelmpi"}
    with pytest.raises(UserError, match=r"spec\.mpi"):
        submission_of({"metadata": {"name": "s"}, "spec": bad})
    (version,) = crd_manifest()["spec"]["versions"]
    field = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["mpi"]
    assert field["enum"] == ["openmpi", "mpich"]


@pytest.mark.parametrize("cluster_up", [True, False])
def test_no_kubeconfig_names_the_dev_clusters_when_one_is_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    cluster_up: bool,
) -> None:  # fmt: skip
    state = tmp_path / "dev-cluster"
    state.mkdir()
    if cluster_up:
        (state / "rankpack-sa.kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    monkeypatch.setenv("RANKPACK_DEV_CLUSTER_DIR", str(state))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kube/config
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setattr("rankpack.backend.kubernetes.api.config.IN_CLUSTER_DIR", tmp_path / "none")
    code = main(["run", "pitzDaily", "--ranks", "2", "--backend", "kubernetes"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "no kubeconfig" in err
    assert (f"--kubeconfig {state / 'rankpack-sa.kubeconfig'}" in err) is cluster_up, err
