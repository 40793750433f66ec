"""The Simulation resource's spec <-> Submission, and its validation (no cluster)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rankpack.errors import UserError
from rankpack.operator import crd
from rankpack.plan.submission import Phase, Submission


@pytest.mark.parametrize(
    "sub",
    [
        Submission(case="pitzDaily", weights=(1, 1, 5, 15), budget_millis=2000, iterations=300),
        Submission(case="/cases/x", weights=(1, 3), budget_millis=1500, floor_millis=100,
                   decompose="weighted", sizing="fixed",
                   phases=(Phase(0.0, (500, 1000)), Phase(0.5, (1000, 500)))),
        Submission(case="pitzDaily", weights=(1, 1), budget_millis=1000, solver="simpleFoam",
                   wait="polite"),
        Submission(case="pitzDaily", weights=(1, 1), budget_millis=1000,
                   image="registry.example.com:5000/cfd/openfoam:12",
                   pull_secrets=("cfd-registry", "backup.registry")),
    ],
)  # fmt: skip
def test_spec_round_trips(sub: Submission) -> None:
    obj = crd.simulation("s", sub, volume="host:/data")
    assert obj["apiVersion"] == "rankpack.dev/v1alpha1" and obj["kind"] == "Simulation"
    assert crd.submission_of(obj) == replace(sub, volume="host:/data")
    assert crd.volume_of(obj) == "host:/data"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "spec.case"),
        ({"case": {"path": ""}}, "spec.case.path is required"),
        ({"case": {"path": "p"}, "ranks": 0}, "spec.ranks must be"),
        ({"case": {"path": "p"}, "ranks": 3, "weights": [1, 2]}, "2 entries for 3 ranks"),
        ({"case": {"path": "p"}, "weights": [0, 0]}, "not all 0"),
        ({"case": {"path": "p"}, "ranks": 2, "iterations": 0}, "at least 1"),
        ({"case": {"path": "p"}, "ranks": 2, "decomposition": "x"}, "spec.decomposition"),
        (
            {
                "case": {"path": "p"},
                "ranks": 2,
                "phases": [{"startFraction": 0, "requestMillis": [1]}],
            },
            "needs 2 values",
        ),
        ({"case": {"path": "p"}, "ranks": 2, "weights": ["a", 1]}, "bad spec"),
        ({"case": {"path": "p"}, "ranks": 2, "solver": "/bin/sh -c x"}, "spec.solver must be"),
        ({"case": {"path": "p"}, "ranks": 2, "solver": "a;b"}, "spec.solver must be"),
        ({"case": {"path": "p"}, "ranks": 2, "wait": "busy"}, "spec.wait must be one of"),
        ({"case": {"path": "p"}, "ranks": 2, "image": "Registry/CFD"}, "spec.image must be"),
        ({"case": {"path": "p"}, "ranks": 2, "image": "a b"}, "spec.image must be"),
        ({"case": {"path": "p"}, "ranks": 2, "image": "x:1$(id)"}, "spec.image must be"),
        ({"case": {"path": "p"}, "ranks": 2, "image": "r/" + "a" * 600}, "spec.image must be"),
        (
            {"case": {"path": "p"}, "ranks": 2, "imagePullSecrets": ["Bad_Name"]},
            "spec.imagePullSecrets",
        ),
        (
            {"case": {"path": "p"}, "ranks": 2, "imagePullSecrets": ["s"] * 9},
            "spec.imagePullSecrets names at most 8",
        ),
    ],
)
def test_a_bad_spec_is_one_clear_error(spec: dict[str, object], message: str) -> None:
    with pytest.raises(UserError) as info:
        crd.submission_of({"metadata": {"name": "bad"}, "spec": spec})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_the_crd_has_a_status_subresource_and_useful_columns() -> None:
    m = crd.crd_manifest()
    (version,) = m["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    printed = version["additionalPrinterColumns"]
    columns = [c["name"] for c in printed if not c.get("priority")]
    wide = [c["name"] for c in printed if c.get("priority") == 1]
    assert columns == ["Phase", "Reason", "Case", "Ranks", "Iter", "ETA", "Duty", "Eff", "Nodes",
                       "Age"]  # fmt: skip
    assert wide == ["Progress", "MinDuty", "Resizes", "Restarts", "Wait", "Run"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"phase", "reason", "message", "restarts", "resizes", "iterations"} <= set(status)
    # every column reads a field the status schema has
    for c in printed:
        path = c["jsonPath"].split(".")[1:]
        if path[0] == "status":
            assert path[1] in status, c
