"""`rankpack operator --namespace` (issue 26, item 7): the namespaces it serves, repeated or
as a comma list; its own namespace (its Lease's); the layout flags; a layout that would share
run directories between namespaces is a one-line error (exit 2) before anything is reached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankpack.cli import main
from rankpack.operator import service
from rankpack.operator.admission import openfoam_applications

pytestmark = pytest.mark.skipif(
    not openfoam_applications(), reason="the default solver allowlist needs OpenFOAM in /usr/bin"
)

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: from-context}}]
current-context: x
"""


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, list[Any]]:
    """A kubeconfig whose server does not answer, and `run_operator` recording its options."""
    seen: list[Any] = []

    def run(opts: Any, **_: Any) -> service.OperatorResult:
        seen.append(opts)
        return service.OperatorResult("idle", 0, 0, [])

    monkeypatch.setattr(service, "run_operator", run)
    monkeypatch.setenv("RANKPACK_HOME", str(tmp_path / "home"))
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path, seen


def test_the_served_namespaces_and_its_own(ran: tuple[Path, list[Any]]) -> None:
    path, seen = ran
    argv = ["operator", "--kubeconfig", str(path), "--until-idle", "--namespace", "a,b",
            "--namespace", "c", "--runs-root", "/srv/{namespace}/runs"]  # fmt: skip
    assert main(argv) == 0
    (opts,) = seen
    assert opts.namespaces == ("a", "b", "c")
    assert opts.config.namespace == "a"  # out of the cluster: the first is its own (the Lease)
    assert str(opts.runs_root) == "/srv/{namespace}/runs"


def test_by_default_it_serves_its_own_namespace(
    ran: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    path, seen = ran
    assert main(["operator", "--kubeconfig", str(path), "--until-idle"]) == 0
    (opts,) = seen
    assert opts.namespaces == () and opts.config.namespace == "from-context"
    assert opts.runs_root == tmp_path / "home" / "runs"


def test_the_admin_bounds_the_memory_of_the_pods_that_run_user_code(
    ran: tuple[Path, list[Any]], capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 39: the admin's default for every Simulation's rank and launcher pods."""
    path, seen = ran
    argv = ["operator", "--kubeconfig", str(path), "--until-idle", "--rank-memory", "512,2048",
            "--rank-ephemeral-storage", "100,1000", "--launcher-memory", "64, 256"]  # fmt: skip
    assert main(argv) == 0
    bounds = seen[0].config.pod_bounds
    assert (bounds.rank_memory_mib, bounds.rank_ephemeral_mib) == ((512, 2048), (100, 1000))
    assert bounds.launcher_memory_mib == (64, 256)
    capfd.readouterr()
    for bad, said in (("4096,256", "above the limit"), ("256", "REQUEST,LIMIT"),
                      ("0,10", "at least 1"), ("1,99999999", "at most 1048576")):  # fmt: skip
        assert main(["operator", "--kubeconfig", str(path), "--rank-memory", bad]) == 2
        err = capfd.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
    assert len(seen) == 1


def test_a_bad_namespace_name_is_a_one_line_error(
    ran: tuple[Path, list[Any]], capfd: pytest.CaptureFixture[str]
) -> None:
    path, seen = ran
    assert main(["operator", "--kubeconfig", str(path), "--namespace", "a,B_2"]) == 2
    assert "'B_2' is not a namespace name" in capfd.readouterr().err and not seen


def test_run_directories_shared_by_namespaces_are_refused_before_any_connection(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kubeconfig"  # its server does not answer: nothing may reach it
    path.write_text(KUBECONFIG)
    monkeypatch.setenv("RANKPACK_HOME", str(tmp_path / "home"))
    assert main(["operator", "--kubeconfig", str(path), "--namespace", "a,b"]) == 2
    err = capfd.readouterr().err
    assert "serving 2 namespaces, --runs-root" in err and "{namespace}" in err, err
    assert len(err.strip().splitlines()) == 1


def test_an_apiserver_refusal_says_its_own_words_on_one_line() -> None:
    from rankpack.backend.kubernetes.api.kubeapi import ApiError
    from rankpack.cli.operator_cmd import _api_error

    words = (
        'simulations.rankpack.dev "x" is invalid:\n'
        "ValidatingAdmissionPolicy denied: CasePathNotAllowed: spec.case.path /tmp/c"
    )
    exc = ApiError(422, "Invalid", words)
    said = str(_api_error(exc, "cannot create Simulation x"))
    assert said.startswith("cannot create Simulation x: 422 Invalid: simulations.rankpack.dev")
    assert "CasePathNotAllowed: spec.case.path /tmp/c" in said and "\n" not in said
    assert str(_api_error(ApiError(404, "Not Found"), "cannot list")).endswith(
        "404 Not Found; is the CRD installed (kubectl apply -f deploy/base/crd.yaml)?")  # fmt: skip
