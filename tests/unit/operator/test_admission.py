"""Admission of Simulation specs (issue 26): host volumes, case paths, solvers and fit are
checked as data against the admin's policy, with a reason code, before anything runs."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from rankpack.errors import UserError
from rankpack.operator import crd
from rankpack.operator.admission import AdmissionPolicy, Refused, admit, openfoam_applications
from rankpack.plan.submission import Submission

SUB = Submission(case="pitzDaily", weights=(1.0, 1.0), budget_millis=1000)
POLICY = AdmissionPolicy(solvers=frozenset({"simpleFoam", "rhoSimpleFoam"}))


def code(sub: Submission, policy: AdmissionPolicy = POLICY) -> str | None:
    try:
        admit(sub, policy)
    except Refused as exc:
        assert str(exc)  # always a message saying what to do
        return exc.code
    return None


@pytest.mark.parametrize(
    ("volume", "prefixes", "want"),
    [
        (None, (), None),
        ("pvc:runs", (), None),
        ("host:/", (), "HostVolumeNotAllowed"),
        ("host:/", ("/srv/rankpack",), "HostVolumeNotAllowed"),
        ("host:/srv/rankpack/runs", ("/srv/rankpack",), None),
        ("host:/srv/rankpack", ("/srv/rankpack/",), None),
        ("host:/srv/rankpack-other", ("/srv/rankpack",), "HostVolumeNotAllowed"),
        ("host:/srv/rankpack/../../etc", ("/srv/rankpack",), "HostVolumeNotAllowed"),
        ("host:srv/rankpack", ("/srv/rankpack",), "HostVolumeNotAllowed"),
    ],
)
def test_host_volumes_need_a_prefix_the_admin_allowed(
    volume: str | None, prefixes: tuple[str, ...], want: str | None
) -> None:
    policy = replace(POLICY, host_prefixes=prefixes)
    assert code(replace(SUB, volume=volume), policy) == want


@pytest.mark.parametrize(
    ("image", "prefixes", "want"),
    [
        (None, (), None),
        ("rankpack/rank:0.1.0", ("rankpack/rank:0.1.0",), None),
        ("rankpack/rank:0.2.0", ("rankpack/rank:0.1.0",), "ImageNotAllowed"),
        ("evil.example/miner:1", ("rankpack/rank:0.1.0",), "ImageNotAllowed"),
        ("registry.example/cfd/foam:12", ("registry.example/cfd",), None),
        ("registry.example/cfd:12", ("registry.example/cfd",), None),
        ("registry.example/cfd@sha256:" + "a" * 64, ("registry.example/cfd",), None),
        ("registry.example/cfd-other/foam:1", ("registry.example/cfd",), "ImageNotAllowed"),
        ("registry.example/cfd/foam:1", ("registry.example/",), None),
        ("registry.example.evil/foam:1", ("registry.example",), "ImageNotAllowed"),
        ("registry.example/cfd/foam:1", (), "ImageNotAllowed"),
    ],
)
def test_an_image_must_lie_under_a_prefix_the_admin_allowed(
    image: str | None, prefixes: tuple[str, ...], want: str | None
) -> None:
    assert code(replace(SUB, image=image), replace(POLICY, images=prefixes)) == want


@pytest.mark.parametrize(
    ("image", "solver", "want"),
    [
        (None, "simpleFoam", None),  # the operator's own image: the default list
        ("registry.example/cfd/foam:12", "simpleFoam", "SolverNotAllowed"),
        ("registry.example/cfd/foam:12", "mySolver", None),
        ("registry.example/cfd/special/foam:1", "mySolver", "SolverNotAllowed"),  # longest wins
        ("registry.example/cfd/special/foam:1", "specialFoam", None),
        ("registry.example/other/foam:1", "simpleFoam", None),  # no list named: the default
    ],
)
def test_an_image_prefix_may_name_the_only_solvers_its_images_run(
    image: str | None, solver: str, want: str | None
) -> None:
    policy = replace(POLICY, images=("registry.example/",), image_solvers=(
        ("registry.example/cfd", frozenset({"mySolver"})),
        ("registry.example/cfd/special", frozenset({"specialFoam"}))))  # fmt: skip
    assert code(replace(SUB, image=image, solver=solver), policy) == want


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("pitzDaily", None),
        ("aerofoilNACA0012", None),
        ("..", "CasePathNotAllowed"),
        ("/etc", "CasePathNotAllowed"),
        ("/root", "CasePathNotAllowed"),
        ("../../../etc", "CasePathNotAllowed"),
        ("relative/case", "CasePathNotAllowed"),
        ("pitz Daily; rm -rf /", "CasePathNotAllowed"),
    ],
)
def test_without_case_roots_only_tutorial_names_pass(path: str, want: str | None) -> None:
    assert code(replace(SUB, case=path)) == want


def test_case_paths_must_stay_under_a_root_also_through_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "cases"
    (root / "mine").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (root / "escape").symlink_to(tmp_path / "secret")
    (root / "inside").symlink_to(root / "mine")
    policy = replace(POLICY, case_roots=(str(root),))
    assert code(replace(SUB, case=str(root / "mine")), policy) is None
    assert code(replace(SUB, case=str(root / "inside")), policy) is None
    assert code(replace(SUB, case=str(root / "escape")), policy) == "CasePathNotAllowed"
    assert code(replace(SUB, case=f"{root}/mine/../../secret"), policy) == "CasePathNotAllowed"
    assert code(replace(SUB, case=str(tmp_path / "secret")), policy) == "CasePathNotAllowed"
    assert code(replace(SUB, case=f"{root}-evil/mine"), policy) == "CasePathNotAllowed"


def test_a_path_outside_every_root_is_never_looked_at() -> None:
    looked: list[str] = []

    def resolve(p: str) -> str:
        looked.append(p)
        return os.path.realpath(p)

    policy = replace(POLICY, case_roots=("/srv/cases",))
    with pytest.raises(Refused):
        admit(replace(SUB, case="/root/.kube"), policy, resolve)
    assert looked == []


def test_with_staging_pods_the_operator_looks_at_no_file_of_a_case(tmp_path: Path) -> None:
    """Issue 39: a link in the case root is not followed by the operator (its staging pod
    resolves the path where only the namespace's part is); the text is still checked."""
    looked: list[str] = []

    def resolve(p: str) -> str:
        looked.append(p)
        return os.path.realpath(p)

    root = tmp_path / "cases"
    root.mkdir()
    (root / "escape").symlink_to(tmp_path)
    policy = replace(POLICY, case_roots=(str(root),), resolve_links=False)
    admit(replace(SUB, case=str(root / "escape")), policy, resolve)  # admitted as text
    assert looked == []
    with pytest.raises(Refused):  # the text out of the root: refused all the same
        admit(replace(SUB, case=f"{root}/escape/../../x"), policy, resolve)


@pytest.mark.parametrize(
    ("solver", "want"),
    [(None, None), ("simpleFoam", None), ("sh", "SolverNotAllowed"), ("bash", "SolverNotAllowed")],
)
def test_the_solver_comes_from_the_allowlist(solver: str | None, want: str | None) -> None:
    assert code(replace(SUB, solver=solver)) == want


def test_a_simulation_that_can_never_fit_is_refused() -> None:
    policy = replace(POLICY, cluster_millis=2000)
    big = Submission(case="pitzDaily", weights=(1.0,) * 4096, budget_millis=4096 * 1000)
    assert code(big, policy) == "DoesNotFit"
    assert code(SUB, policy) is None
    # a floor counts: 4 ranks of at least 600m do not fit 2 cores
    floored = Submission(case="pitzDaily", weights=(1.0,) * 4, budget_millis=4000, floor_millis=600)
    assert code(floored, policy) == "DoesNotFit"
    assert code(big, POLICY) is None  # the cluster's size unknown: no fit check


def test_a_simulation_that_fits_once_a_lost_node_is_back_is_not_refused() -> None:
    from rankpack.backend.protocol import Inventory, NodeCapacity
    from rankpack.operator.service import _cluster_millis

    class Backend:  # only what the fit check reads: one Ready node, one lost
        def inventory(self) -> Inventory:
            return Inventory((NodeCapacity("n1", 2000, 0),), unready_millis=4000)

    millis = _cluster_millis(Backend())  # type: ignore[arg-type]  # a stand-in inventory
    assert millis() == 6000
    floored = Submission(case="pitzDaily", weights=(1.0,) * 4, budget_millis=4000, floor_millis=600)
    assert code(floored, replace(POLICY, cluster_millis=millis())) is None  # held, not refused
    big = Submission(case="pitzDaily", weights=(1.0,) * 8, budget_millis=8000, floor_millis=1000)
    assert code(big, replace(POLICY, cluster_millis=millis())) == "DoesNotFit"


def test_openfoams_applications_are_the_default_allowlist(tmp_path: Path) -> None:
    for name in ("simpleFoam", "pimpleFoam", "blockMesh", "sh"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    (tmp_path / "notExecutableFoam").write_text("")
    assert openfoam_applications(tmp_path) == {"simpleFoam", "pimpleFoam"}
    assert openfoam_applications(tmp_path / "missing") == frozenset()


def test_a_budget_that_leaves_a_rank_without_cpu_is_invalid() -> None:
    obj = {"metadata": {"name": "s"},
           "spec": {"case": {"path": "pitzDaily"}, "ranks": 2, "budgetMillis": 1}}  # fmt: skip
    with pytest.raises(UserError, match="gives rank 1 0m"):
        crd.submission_of(obj)
    rule = crd.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]["x-kubernetes-validations"][0]["rule"]
    assert "self.budgetMillis >= self.ranks" in rule


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--case-root", "relative/cases", "--case-root 'relative/cases' must be an absolute"),
        ("--allow-host-path", "/srv/../etc", "--allow-host-path '/srv/../etc' must be"),
        ("--solver", "sh -c id", "--solver must be a command name"),
        ("--allow-image", "Registry/CFD", "--allow-image 'Registry/CFD' must be an image"),
        ("--allow-image", "registry.example/cfd=", "name its solvers after '='"),
        ("--allow-image", "registry.example/cfd=sh -c id", "must be a command name"),
    ],
)
def test_bad_admission_flags_are_one_line_errors(
    flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankpack.cli import main

    assert main(["operator", flag, value, "--kubeconfig", "/nonexistent"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and "Traceback" not in err
