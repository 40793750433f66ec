"""Pure builders: table tests with named cases (spec in, object out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.api.config import DEV_IMAGE, HostPathVolume, PvcVolume
from rankpack.backend.kubernetes.objects import builders
from rankpack.backend.protocol import BackendError, RankResources
from tests.unit.backend.kubernetes._helpers import CASE, sim_spec

OWNER = builders.OwnerRef("rankpack-s1", "uid-1")


@pytest.mark.parametrize(
    ("sim_id", "ok"),
    [("s1a2b3", True), ("S1", False), ("s_1", False), ("x" * 50, True), ("x" * 60, False)],
    ids=["hex", "uppercase", "underscore", "long-ok", "too-long"],
)
def test_sim_ids_must_name_pods(sim_id: str, ok: bool) -> None:
    if ok:
        builders.check_sim_id(sim_id, 4)
    else:
        with pytest.raises(BackendError):
            builders.check_sim_id(sim_id, 4)


def test_owner_configmap_holds_the_spec_and_a_launchers_files() -> None:
    cm = builders.owner_configmap(sim_spec(), DEV_IMAGE)
    assert cm["metadata"]["name"] == "rankpack-s1"
    assert cm["metadata"]["labels"] == {
        "rankpack.dev/run-id": "7",
        "app.kubernetes.io/managed-by": "rankpack",
        "rankpack.dev/sim": "s1",
        "rankpack.dev/role": "owner",
    }
    assert sorted(cm["data"]) == ["spec.json"]  # a host-mode simulation: nothing more
    assert '"case_dir": "/runs/r1"' in cm["data"]["spec.json"]
    assert "ownerReferences" not in cm["metadata"]
    files = {"launch.json": "{}", "hostfile": "rankpack-s1-g0 slots=2\n"}
    keyed_cm = builders.owner_configmap(sim_spec(), DEV_IMAGE, "k3y", files)
    assert keyed_cm["data"] == {**files, "key": "k3y", "spec.json": cm["data"]["spec.json"]}


def test_service_is_headless_and_owned() -> None:
    svc = builders.headless_service(sim_spec(), OWNER)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {
        "app.kubernetes.io/managed-by": "rankpack",
        "rankpack.dev/sim": "s1",
    }
    assert svc["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "rankpack-s1", "uid": "uid-1",
         "controller": True}
    ]  # fmt: skip


LIVE = {"name": "rankpack-live", "emptyDir": {}}
"""The shim's records: the pod's own volume, never the case volume nor a host path."""

POD_CASES = [
    pytest.param(
        {"rank": 0, "image": DEV_IMAGE, "volume": HostPathVolume(CASE)},
        {
            "resources": {"requests": {"cpu": "250m"}},
            "pull": "Never",
            "volumes": [
                {"name": "case", "hostPath": {"path": "/runs/r1", "type": "Directory"}},
                LIVE,
                {"name": "host-usr", "hostPath": {"path": "/usr", "type": "Directory"}},
            ],
            "mounts": ["/runs/r1", "/var/run/rankpack", "/usr"],
        },
        id="dev-image-request-only",
    ),
    pytest.param(
        {"rank": 1, "image": "ghcr.io/x/foam:1", "volume": PvcVolume("runs", Path("/runs"))},
        {
            "resources": {"requests": {"cpu": "1250m"}, "limits": {"cpu": "1500m"}},
            "pull": None,
            "volumes": [{"name": "case", "persistentVolumeClaim": {"claimName": "runs"}}, LIVE],
            "mounts": ["/runs/r1", "/var/run/rankpack"],
        },
        id="real-image-pvc-with-limit",
    ),
]


@pytest.mark.parametrize(("given", "want"), POD_CASES)
def test_rank_pod(given: dict[str, Any], want: dict[str, Any]) -> None:
    pod = builders.rank_pod(sim_spec(), given["rank"], OWNER, given["volume"], given["image"])
    name = f"rankpack-s1-{given['rank']}"
    assert pod["metadata"]["name"] == name
    assert pod["metadata"]["labels"]["rankpack.dev/rank"] == str(given["rank"])
    assert pod["metadata"]["labels"]["rankpack.dev/sim"] == "s1"
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rankpack"
    assert pod["metadata"]["labels"]["rankpack.dev/run-id"] == "7"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    s = pod["spec"]
    assert (s["hostname"], s["subdomain"]) == (name, "rankpack-s1")
    assert s["restartPolicy"] == "Never"
    (c,) = s["containers"]
    assert c["image"] == given["image"]
    assert c.get("imagePullPolicy") == want["pull"]
    assert c["resources"] == want["resources"]
    assert c["resizePolicy"] == [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]
    assert c["workingDir"] == "/runs/r1"
    assert c["command"][:2] == ["/bin/sh", "-c"] and "sleep" in c["command"][2]
    assert [m["mountPath"] for m in c["volumeMounts"]] == want["mounts"]
    assert s["volumes"] == want["volumes"]
    assert "nodeSelector" not in s
    assert s["automountServiceAccountToken"] is False
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if want["pull"] is None:  # a real image: its user is rankpack, uid 1000
        restricted["runAsNonRoot"] = True
    assert c["securityContext"] == restricted


def test_the_shims_records_live_in_the_pods_own_empty_dir() -> None:
    pod = builders.rank_pod(sim_spec(), 0, OWNER, PvcVolume("runs", Path("/runs")), "img")
    (c,) = pod["spec"]["containers"]
    live = [m for m in c["volumeMounts"] if m["name"] == "rankpack-live"]
    assert live == [{"name": "rankpack-live", "mountPath": "/var/run/rankpack"}]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "rankpack-live"]
    assert volume == LIVE  # on the node's disk: not a tmpfs the agent would not see
    assert not any("hostPath" in v for v in pod["spec"]["volumes"])


def test_placement_becomes_node_selector() -> None:
    pod = builders.rank_pod(
        sim_spec(placement={"kubernetes.io/hostname": "n1"}), 0, OWNER, HostPathVolume(CASE), "img"
    )
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "n1"}


def test_each_rank_gets_a_required_affinity_to_its_node_and_never_a_node_name() -> None:
    placed = sim_spec(rank_nodes=("n0", "n1"))
    for rank, node in enumerate(("n0", "n1")):
        pod = builders.rank_pod(placed, rank, OWNER, HostPathVolume(CASE), "img")
        assert "nodeName" not in pod["spec"]  # the scheduler's fit check still applies
        assert pod["spec"]["affinity"] == {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                ]}
            ]}
        }}  # fmt: skip
    assert '"rank_nodes": ["n0", "n1"]' in builders.spec_json(placed, "img")
    # no node decided (one node, the local backend's spec): nothing changes
    pod = builders.rank_pod(sim_spec(), 0, OWNER, HostPathVolume(CASE), "img")
    assert "affinity" not in pod["spec"] and "nodeSelector" not in pod["spec"]
    assert "rank_nodes" not in builders.spec_json(sim_spec(), "img")


@pytest.mark.parametrize(
    ("res", "want"),
    [
        (RankResources(500), {"requests": {"cpu": "500m"}}),
        (RankResources(500, 800), {"requests": {"cpu": "500m"}, "limits": {"cpu": "800m"}}),
    ],
    ids=["request", "request-and-limit"],
)
def test_resize_patch(res: RankResources, want: dict[str, Any]) -> None:
    assert builders.resize_patch(res) == {
        "spec": {"containers": [{"name": "rank", "resources": want}]}
    }
