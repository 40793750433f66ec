"""Rank-group pods and their hostfile: table tests with named cases (spec in, object out)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.api.config import DEV_IMAGE, HostPathVolume, PvcVolume
from rankpack.backend.kubernetes.objects import builders, grouppods, launcherpods
from rankpack.backend.kubernetes.objects.groups import RankGroup, plan_groups
from rankpack.backend.protocol import BackendError, RankResources
from tests.unit.backend.kubernetes._helpers import CASE, sim_spec

OWNER = builders.OwnerRef("rankpack-s1", "uid-1")
LIVE = {"name": "rankpack-live", "emptyDir": {}}
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
FOUR = (RankResources(100), RankResources(100), RankResources(500), RankResources(1500))


def shm(size: str) -> dict[str, Any]:
    return {"name": "rankpack-shm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}


GROUP_POD_CASES = [
    pytest.param(
        {
            "ranks": FOUR,
            "group": RankGroup(0, None, (0, 1, 2, 3)),
            "image": DEV_IMAGE,
            "volume": HostPathVolume(CASE),
        },
        {
            "name": "rankpack-s1-g0",
            "ranks": "0-3",
            "resources": {"requests": {"cpu": "2200m"}},
            "pull": "Never",
            "volumes": [
                {"name": "case", "hostPath": {"path": "/runs/r1", "type": "Directory"}},
                LIVE,
                shm("256Mi"),
                {"name": "host-usr", "hostPath": {"path": "/usr", "type": "Directory"}},
            ],
            "mounts": ["/runs/r1", "/var/run/rankpack", "/dev/shm", "/usr"],
            "node": None,
        },
        id="dev-image-unplaced-all-ranks",
    ),
    pytest.param(
        {
            "ranks": (RankResources(250, 500), RankResources(1250, 1500), RankResources(100)),
            "group": RankGroup(1, "n1", (0, 1)),
            "image": "ghcr.io/x/foam:1",
            "volume": PvcVolume("runs", Path("/runs")),
        },
        {
            "name": "rankpack-s1-g1",
            "ranks": "0-1",
            "resources": {"requests": {"cpu": "1500m"}, "limits": {"cpu": "2000m"}},
            "pull": None,
            "volumes": [
                {"name": "case", "persistentVolumeClaim": {"claimName": "runs"}},
                LIVE,
                shm("128Mi"),
            ],
            "mounts": ["/runs/r1", "/var/run/rankpack", "/dev/shm"],
            "node": "n1",
        },
        id="real-image-pvc-placed-limits",
    ),
    pytest.param(
        {
            "ranks": FOUR,
            "group": RankGroup(3, "n0", (3,)),
            "image": "img",
            "volume": PvcVolume("runs", Path("/runs")),
        },
        {
            "name": "rankpack-s1-g3",
            "ranks": "3",
            "resources": {"requests": {"cpu": "1500m"}},
            "pull": None,
            "volumes": [
                {"name": "case", "persistentVolumeClaim": {"claimName": "runs"}},
                LIVE,
                shm("64Mi"),
            ],
            "mounts": ["/runs/r1", "/var/run/rankpack", "/dev/shm"],
            "node": "n0",
        },
        id="one-rank-group",
    ),
]


@pytest.mark.parametrize(("given", "want"), GROUP_POD_CASES)
def test_group_pod(given: dict[str, Any], want: dict[str, Any]) -> None:
    spec = sim_spec(ranks=given["ranks"])
    pod = grouppods.group_pod(spec, given["group"], OWNER, given["volume"], given["image"])
    meta = pod["metadata"]
    assert meta["name"] == want["name"]
    assert meta["labels"] == {
        "rankpack.dev/run-id": "7",
        "app.kubernetes.io/managed-by": "rankpack",
        "rankpack.dev/sim": "s1",
        "rankpack.dev/group": str(given["group"].index),
    }
    assert meta["annotations"] == {"rankpack.dev/ranks": want["ranks"]}
    assert meta["ownerReferences"][0]["uid"] == "uid-1"
    s = pod["spec"]
    assert (s["hostname"], s["subdomain"]) == (want["name"], "rankpack-s1")
    assert (s["restartPolicy"], s["automountServiceAccountToken"]) == ("Never", False)
    assert "serviceAccountName" not in s and "nodeName" not in s
    (c,) = s["containers"]
    assert (c["name"], c["image"]) == ("rank", given["image"])
    assert c.get("imagePullPolicy") == want["pull"]
    assert c["resources"] == want["resources"]
    assert c["resizePolicy"] == [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]
    assert c["command"][:2] == ["/bin/sh", "-c"] and "sleep" in c["command"][2]
    assert c["workingDir"] == "/runs/r1"
    assert [m["mountPath"] for m in c["volumeMounts"]] == want["mounts"]
    assert s["volumes"] == want["volumes"]
    restricted = dict(RESTRICTED, **({} if want["pull"] else {"runAsNonRoot": True}))
    assert c["securityContext"] == restricted
    if want["node"] is None:
        assert "affinity" not in s
    else:
        assert s["affinity"] == builders.node_affinity(want["node"])


def test_a_group_pod_is_a_rank_pod_but_for_what_makes_it_a_group() -> None:
    """Everything but name, labels, annotations, resources and /dev/shm is shared."""
    spec = sim_spec(ranks=(RankResources(250), RankResources(750)), rank_nodes=("n0", "n0"))
    volume = PvcVolume("runs", Path("/runs"))
    group = plan_groups(2, spec.rank_nodes)[0]
    pod = grouppods.group_pod(spec, group, OWNER, volume, "img", service_account="rankpack-rank")
    rank = builders.rank_pod(spec, 0, OWNER, volume, "img", service_account="rankpack-rank")
    assert pod["spec"]["affinity"] == rank["spec"]["affinity"]
    assert pod["spec"]["serviceAccountName"] == "rankpack-rank"
    for s in (pod["spec"], rank["spec"]):
        s.pop("hostname")
        (c,) = s["containers"]
        c.pop("resources")
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != "/dev/shm"]
        s["volumes"] = [v for v in s["volumes"] if v["name"] != "rankpack-shm"]
    assert pod["spec"] == rank["spec"]
    assert pod["apiVersion"] == rank["apiVersion"] and pod["kind"] == rank["kind"]


def test_a_run_label_cannot_make_a_group_pod_one_ranks() -> None:
    own = {"rankpack.dev/rank": "0", "rankpack.dev/group": "9", "team": "a"}
    spec = sim_spec(ranks=FOUR, labels=own)
    pod = grouppods.group_pod(spec, RankGroup(0, None, (0, 1)), OWNER, HostPathVolume(CASE), "i")
    labels = pod["metadata"]["labels"]
    assert "rankpack.dev/rank" not in labels
    assert (labels["rankpack.dev/group"], labels["team"]) == ("0", "a")


@pytest.mark.parametrize(
    ("ranks", "group", "match"),
    [
        (FOUR, RankGroup(1, None, (3, 4)), "holds rank 4; the simulation has 4"),
        ((RankResources(250), RankResources(1250, 1500)), RankGroup(0, None, (0, 1)), "limit"),
    ],
    ids=["beyond-the-ranks", "mixed-limits"],
)
def test_group_pod_refuses(ranks: Any, group: RankGroup, match: str) -> None:
    with pytest.raises(BackendError, match=match):
        grouppods.group_pod(sim_spec(ranks=ranks), group, OWNER, HostPathVolume(CASE), "img")


def test_a_groups_resize_is_the_rank_containers_patch() -> None:
    """`builders.resize_patch` serves groups: it patches the one container by name."""
    spec = sim_spec(ranks=FOUR)
    pod = grouppods.group_pod(
        spec, RankGroup(0, None, (0, 1, 2, 3)), OWNER, PvcVolume("r", Path("/r")), "i"
    )
    (patched,) = builders.resize_patch(RankResources(2200))["spec"]["containers"]
    (c,) = pod["spec"]["containers"]
    assert (patched["name"], patched["resources"]) == (c["name"], c["resources"])


HOSTFILE_CASES = [
    pytest.param(
        "openmpi",
        ("n0", "n0", "n0", "n1", "n1"),
        "rankpack-s1-g0 slots=3\nrankpack-s1-g1 slots=2\n",
        id="openmpi",
    ),
    pytest.param(
        "mpich", ("n0", "n0", "n0", "n1", "n1"), "rankpack-s1-g0:3\nrankpack-s1-g1:2\n", id="mpich"
    ),
    pytest.param("openmpi", (), "rankpack-s1-g0 slots=5\n", id="unplaced-one-line"),
    pytest.param(
        "mpich",
        ("a", "b", "a", "a", "a"),
        "rankpack-s1-g0:1\nrankpack-s1-g1:1\nrankpack-s1-g2:3\n",
        id="a-node-again",
    ),
]


@pytest.mark.parametrize(("flavour", "nodes", "want"), HOSTFILE_CASES)
def test_group_hostfile(flavour: str, nodes: tuple[str, ...], want: str) -> None:
    planned = plan_groups(5, nodes)
    assert grouppods.group_hostfile("s1", planned, flavour) == want


@pytest.mark.parametrize(
    ("sim_id", "n_groups", "ok"),
    [("x" * 50, 10, True), ("x" * 51, 10, True), ("x" * 51, 11, False), ("S1", 1, False)],
    ids=["long-ok", "longest-ok", "g10-too-long", "uppercase"],
)
def test_group_pod_names_must_be_hostnames(sim_id: str, n_groups: int, ok: bool) -> None:
    planned = plan_groups(n_groups, [f"n{i}" for i in range(n_groups)])
    if ok:
        grouppods.check_group_pod_names(sim_id, planned)
    else:
        with pytest.raises(BackendError, match="group pod"):
            grouppods.check_group_pod_names(sim_id, planned)


# -- reading groups back from the API's pods (untrusted: anyone who may edit a pod) ----------

FIVE = tuple(RankResources(100 * (r + 1)) for r in range(5))


def _listed(nodes: tuple[str, ...] = ("n0", "n0", "n0", "n1", "n1")) -> list[Any]:
    """The group pods of a five-rank simulation as the API lists them (scheduled)."""
    spec = sim_spec(ranks=FIVE, rank_nodes=nodes)
    pods = []
    for group in plan_groups(5, nodes):
        pod = grouppods.group_pod(spec, group, OWNER, HostPathVolume(CASE), "img")
        pod["spec"]["nodeName"] = group.node
        pods.append(pod)
    return pods


def _edited(pod: Any, *, group: str | None = None, ranks: str | None = None) -> Any:
    pod = copy.deepcopy(pod)
    if group is not None:
        pod["metadata"]["labels"][grouppods.GROUP_LABEL] = group
    if ranks is not None:
        pod["metadata"]["annotations"][grouppods.RANKS_ANNOTATION] = ranks
    return pod


def test_a_group_pods_ranks_come_back_from_its_annotation() -> None:
    g0, g1 = _listed()
    assert (grouppods.pod_ranks(g0), grouppods.pod_ranks(g1)) == ((0, 1, 2), (3, 4))
    assert grouppods.groups_of_pods([g1, g0], 5) == plan_groups(5, ("n0",) * 3 + ("n1",) * 2)
    unscheduled = copy.deepcopy(g0)
    del unscheduled["spec"]["nodeName"]
    one = grouppods.groups_of_pods([_edited(unscheduled, ranks="0-4")], 5)
    assert one == (RankGroup(0, None, (0, 1, 2, 3, 4)),)


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param({"ranks": "0-2; rm -rf /"}, id="forged-annotation"),
        pytest.param({"ranks": "2-0"}, id="descending"),
        pytest.param({"ranks": "0,1,2"}, id="a-list"),
        pytest.param({"ranks": ""}, id="empty"),
        pytest.param({"ranks": "0-4096"}, id="beyond-max-ranks"),
    ],
)
def test_an_edited_annotation_holds_no_ranks(edit: dict[str, str]) -> None:
    g0, g1 = _listed()
    forged = _edited(g0, **edit)
    assert grouppods.pod_ranks(forged) == ()
    assert grouppods.groups_of_pods([forged, g1], 5) is None


def test_a_pod_that_is_no_group_pod_holds_no_ranks() -> None:
    g0, _ = _listed()
    no_label = copy.deepcopy(g0)
    del no_label["metadata"]["labels"][grouppods.GROUP_LABEL]
    no_annotation = copy.deepcopy(g0)
    del no_annotation["metadata"]["annotations"]
    rank_pod = builders.rank_pod(sim_spec(), 0, OWNER, HostPathVolume(CASE), "img")
    for pod in (no_label, no_annotation, rank_pod, {}):
        assert grouppods.pod_ranks(pod) == ()


@pytest.mark.parametrize(
    "pods",
    [
        pytest.param(lambda g0, g1: [g0], id="a-pod-missing"),
        pytest.param(lambda g0, g1: [g0, _edited(g1, ranks="4")], id="a-gap"),
        pytest.param(lambda g0, g1: [g0, _edited(g1, ranks="2-4")], id="a-rank-twice"),
        pytest.param(lambda g0, g1: [g0, _edited(g1, group="0")], id="a-group-twice"),
        pytest.param(lambda g0, g1: [g0, _edited(g1, group="2")], id="an-index-skipped"),
        pytest.param(lambda g0, g1: [g0, _edited(g1, group="x")], id="an-index-not-a-number"),
        pytest.param(
            lambda g0, g1: [_edited(g0, ranks="3-4"), _edited(g1, ranks="0-2")], id="out-of-order"
        ),
        pytest.param(lambda g0, g1: [g0, _edited(g1, ranks="3-5")], id="more-ranks"),
        pytest.param(lambda g0, g1: [], id="none"),
    ],
)
def test_pods_that_do_not_cover_the_ranks_once_in_order_are_no_groups(
    pods: Callable[[Any, Any], list[Any]],
) -> None:
    g0, g1 = _listed()
    assert grouppods.groups_of_pods(pods(g0, g1), 5) is None


def test_a_group_pod_bounds_memory_and_disk_by_its_ranks_never_cpu() -> None:
    from rankpack.backend.kubernetes.api.config import PodBounds
    from rankpack.backend.kubernetes.objects.grouppods import group_pod
    from rankpack.backend.kubernetes.objects.groups import RankGroup

    bounds = PodBounds(rank_memory_mib=(100, 1000), rank_ephemeral_mib=(10, 200))
    spec = sim_spec(ranks=(RankResources(250), RankResources(500)))
    pod = group_pod(spec, RankGroup(0, None, (0, 1)), OWNER,
                    PvcVolume("runs", Path("/runs")), "img", bounds=bounds)  # fmt: skip
    (c,) = pod["spec"]["containers"]
    assert c["resources"]["requests"]["memory"] == "200Mi"
    assert c["resources"]["limits"] == {"memory": "2000Mi", "ephemeral-storage": "400Mi"}


def test_a_keyed_group_pod_runs_rankd_with_its_key_and_an_unkeyed_one_idles() -> None:
    from rankpack.backend.kubernetes.objects import keyed

    group = RankGroup(0, None, (0,))
    volume = PvcVolume("runs", Path("/runs"))
    pod = grouppods.group_pod(sim_spec(), group, OWNER, volume, "img", keyed=True)
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["/runs/r1/.rankpack/bin/rankpack-rankd"]  # (the case volume's tools)
    (key,) = [v for v in pod["spec"]["volumes"] if v["name"] == keyed.KEY_VOLUME]
    assert key["configMap"] == {"name": OWNER.name, "items": [{"key": "key", "path": "key"}],
                                "defaultMode": 0o444}  # fmt: skip
    assert {"name": keyed.KEY_VOLUME, "mountPath": "/etc/rankpack/sim", "readOnly": True} in c[
        "volumeMounts"]  # fmt: skip
    plain = grouppods.group_pod(sim_spec(), group, OWNER, volume, "img")
    (c,) = plain["spec"]["containers"]
    assert c["command"] == list(builders.IDLE_COMMAND)
    assert all(v["name"] != keyed.KEY_VOLUME for v in plain["spec"]["volumes"])


def test_only_a_launcher_pod_simulations_owner_holds_a_key() -> None:
    assert "key" not in builders.owner_configmap(sim_spec(), "img")["data"]
    assert builders.owner_configmap(sim_spec(), "img", "k1")["data"]["key"] == "k1"


def test_every_pod_of_a_simulation_runs_its_image_pulled_with_its_secrets() -> None:
    """spec.image and spec.imagePullSecrets reach the group pods, the launcher pod and the
    staging pod (its OpenFOAM sidecar; the kubelet reads the Secrets; rankpack reads
    none)."""
    from rankpack.backend.kubernetes.api.config import StagingBounds
    from rankpack.backend.kubernetes.objects import stagepods

    image, secrets = "registry.example/cfd/foam:12", ("cfd-registry", "mirror")
    spec = sim_spec(ranks=FOUR, image=image, pull_secrets=secrets)
    volume = PvcVolume("runs", Path("/runs"))
    options = launcherpods.LauncherOptions("{}", "h slots=4\n", "rankpack-launcher")
    pods = [
        grouppods.group_pod(spec, RankGroup(0, None, (0, 1, 2, 3)), OWNER, volume, image),
        launcherpods.launcher_pod(spec, OWNER, volume, image, options),
        stagepods.staging_pod(
            "s1",
            "{}",
            image=image,
            tools_image="rankpack/rank:1",
            volume=volume,
            run_dir=CASE,
            case_root=None,
            bounds=StagingBounds(deadline_s=60),
            pull_secrets=secrets,
        ),
    ]
    assert [c["image"] for c in pods[0]["spec"]["containers"]] == [image]
    # the launcher pod: rankpack's prepare (no tools_image given: the simulation's), mpirun
    assert [c["image"] for c in pods[1]["spec"]["containers"]] == [image, image]
    sidecar = next(c for c in pods[2]["spec"]["initContainers"] if c["name"] == "openfoam")
    assert sidecar["image"] == image
    for pod in pods:
        assert pod["spec"]["imagePullSecrets"] == [{"name": "cfd-registry"}, {"name": "mirror"}]
    plain = grouppods.group_pod(sim_spec(ranks=FOUR), RankGroup(0, None, (0, 1, 2, 3)), OWNER,
                                volume, image)  # fmt: skip
    assert "imagePullSecrets" not in plain["spec"]
