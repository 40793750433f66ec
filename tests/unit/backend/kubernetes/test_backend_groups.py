"""KubernetesBackend with rank groups (decision 0012, issue 38), against FakeKubeApi: a
simulation's ranks on one node share one pod (its CPU their sum, its own ``/dev/shm``, one
hostfile line with a slot per rank), the ranks start through the rank launcher at their nice
values, and a rank's resize is its group pod's (the new sum) and its group's nice values."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from rankpack.backend.kubernetes.objects import grouppods
from rankpack.backend.kubernetes.objects.groups import split_group
from rankpack.backend.protocol import RankResources, ResizeState
from rankpack.backend.ranknice import nices
from tests.unit.backend.kubernetes._helpers import node_object
from tests.unit.backend.kubernetes.test_backend import (
    PLACED,
    PLACED_PODS,
    POD,
    SIM,
    Harness,
)

pytestmark = pytest.mark.timeout(20)


def _cpu(h: Harness, pod: str) -> str:
    """The CPU request of a pod's container in the fake."""
    return str(
        h.api.objects[("pods", pod)]["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    )


def _xs(argv: list[str]) -> dict[str, str]:
    """The ranks' environment mpirun passes on (``-x NAME=VALUE``)."""
    pairs = [argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-x"]
    return {name: value for name, value in pairs}


# -- the launch ------------------------------------------------------------------------------


def test_ranks_that_fit_one_node_share_one_pod_started_through_the_rank_launcher(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    h.api.nodes = [node_object("node-1")]  # 4 CPUs: room for the 2000m of the three ranks
    h.backend.launch(h.spec())
    assert [a[2] for a in h.api.writes() if a[:2] == ("create", "pods")] == [POD]
    pod = h.api.objects[("pods", POD)]
    assert _cpu(h, POD) == "2000m"  # 250m + 250m + 1500m
    assert "affinity" not in pod["spec"]  # unplaced: the scheduler places it
    assert pod["metadata"]["annotations"] == {grouppods.RANKS_ANNOTATION: "0-2"}
    shm = {"name": grouppods.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "192Mi"}}
    assert shm in pod["spec"]["volumes"]
    (c,) = pod["spec"]["containers"]
    assert {"name": grouppods.SHM_VOLUME, "mountPath": "/dev/shm"} in c["volumeMounts"]
    rankpack = h.case / ".rankpack"
    assert (rankpack / "hostfile").read_text() == f"{POD} slots=3\n"
    packaged = resources.files("rankpack.backend") / "rank_launcher.sh"
    assert (rankpack / "rank-launcher").read_bytes() == packaged.read_bytes()
    h.run_all()
    (proc,) = h.procs
    assert proc.argv[proc.argv.index("-np") + 1] == "3"  # three ranks in one pod
    launcher = str(rankpack / "rank-launcher")
    assert proc.argv[-4:] == ["/bin/sh", launcher, "simpleFoam", "-parallel"]
    env = _xs(proc.argv)
    assert nices([250, 250, 1500]) == [8, 8, 0]  # (the kernel's weights: 172/1024 ~ 1/6)
    assert env["RANKPACK_RANK_NICE"] == "8,8,0"
    assert env["RANKPACK_PID_DIR"] == "/var/run/rankpack"
    assert h.api.requests.counts().get(("create", "pods/exec", 200)) == 1  # one pod to enter


def test_each_ranks_observation_names_its_group_pod(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    obs = h.backend.observe(SIM)
    assert [r.pod for r in obs.ranks] == [POD] * 3
    assert h.usage.reads == [(POD, 0), (POD, 1), (POD, 2)]  # each rank read in its pod
    (tmp_path / "placed").mkdir()
    placed = Harness(tmp_path / "placed")
    placed.backend.launch(placed.spec(rank_nodes=PLACED))
    placed.run_all()
    obs = placed.backend.observe(SIM)
    assert [r.pod for r in obs.ranks] == [PLACED_PODS[0], PLACED_PODS[0], PLACED_PODS[1]]
    assert [r.node for r in obs.ranks] == list(PLACED)


def test_the_inventory_counts_the_ranks_of_group_pods(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.api.nodes = [node_object("node-1")]
    h.backend.launch(h.spec())
    h.run_all()
    (node,) = h.backend.inventory().nodes
    assert (node.name, node.requested_millis, node.rank_pods) == ("node-1", 2000, 3)
    assert node.rank_groups  # its ranks share a cgroup: they yield to each other


def test_a_pod_claiming_another_groups_rank_is_ignored(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    forged = {
        "metadata": {
            "name": f"rankpack-{SIM}-g7",
            "labels": {"rankpack.dev/sim": SIM, grouppods.GROUP_LABEL: "7"},
            "annotations": {grouppods.RANKS_ANNOTATION: "2"},
        },
        "spec": {"containers": [{"name": "rank", "resources": {"requests": {"cpu": "9"}}}]},
    }
    h.api.create("pods", forged)
    h.api.run_pod(f"rankpack-{SIM}-g7", node="node-9")
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert (obs.ranks[2].pod, obs.ranks[2].node) == (POD, "node-1")
    assert h.backend.sims[SIM].pods[2]["metadata"]["name"] == POD


# -- resizes: the group pod's sum, the group's nice values -----------------------------------


def _running(tmp_path: Path) -> Harness:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    h.api.actions.clear()
    return h


def test_a_ranks_resize_is_its_group_pods_new_sum_and_nice_values(tmp_path: Path) -> None:
    h = _running(tmp_path)
    st = h.backend.resize(SIM, 0, RankResources(500))
    assert (st.from_millis, st.to_millis) == (250, 500)  # the rank's own
    assert h.api.writes() == [("patch", "pods/resize", POD)]  # one patch, of the group pod
    assert _cpu(h, POD) == "2250m"  # 500m + 250m + 1500m
    assert h.usage.nices == [(SIM, POD, dict(enumerate(nices([500, 250, 1500]))))]
    assert h.usage.nices[0][2] == {0: 5, 1: 8, 2: 0}
    assert h.backend.sims[SIM].resizes[0].target == RankResources(2250)
    h.api.settle_resize(POD)
    h.backend.poll_once()
    rank = h.backend.observe(SIM).ranks[0]
    assert rank.resize is not None and rank.resize.state is ResizeState.COMPLETED
    assert rank.desired == RankResources(500)


def test_nice_values_the_node_cannot_set_now_are_set_at_the_next_observation(
    tmp_path: Path,
) -> None:
    h = _running(tmp_path)
    h.usage.nices_refused = "node agent on node-1 unreachable: timed out"
    st = h.backend.resize(SIM, 0, RankResources(500))
    assert st.state is ResizeState.PENDING  # the resize itself went through
    sim = h.backend.sims[SIM]
    assert h.usage.nices == [] and sim.nices_due == {0: {0: 5, 1: 8, 2: 0}}
    h.backend.observe(SIM)  # still refused: kept
    assert h.usage.nices == [] and sim.nices_due == {0: {0: 5, 1: 8, 2: 0}}
    h.usage.nices_refused = None
    h.backend.observe(SIM)
    assert h.usage.nices == [(SIM, POD, {0: 5, 1: 8, 2: 0})] and sim.nices_due == {}
    h.backend.observe(SIM)
    assert len(h.usage.nices) == 1  # set once


def test_a_groups_earlier_resize_completes_with_its_latest_target(tmp_path: Path) -> None:
    h = _running(tmp_path)
    h.backend.resize(SIM, 0, RankResources(500))  # the pod to 2250m
    h.backend.resize(SIM, 1, RankResources(400))  # then to 2400m, before the kubelet acted
    assert h.api.writes() == [("patch", "pods/resize", POD)] * 2
    sim = h.backend.sims[SIM]
    assert sim.resizes[0].target == sim.resizes[1].target == RankResources(2400)
    h.api.settle_resize(POD)  # the pod reaches 2400m, never 2250m
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    for rank in obs.ranks[:2]:
        assert rank.resize is not None and rank.resize.state is ResizeState.COMPLETED
    assert [r.desired for r in obs.ranks] == [
        RankResources(500),
        RankResources(400),
        RankResources(1500),
    ]
    assert h.usage.nices[-1] == (SIM, POD, dict(enumerate(nices([500, 400, 1500]))))


def test_adopting_a_resized_group_pod_splits_its_sum_in_the_launched_ratio(
    tmp_path: Path,
) -> None:
    h = _running(tmp_path)
    h.backend.resize(SIM, 2, RankResources(500))  # the pod from 2000m to 1000m
    later = h.make()
    later.adopt(SIM, h.spec())
    later.poll_once()
    desired = [r.desired for r in later.observe(SIM).ranks]
    # which rank moved is not in the pod: its sum, in the ratio of the launch
    assert desired == [RankResources(125), RankResources(125), RankResources(750)]


# -- groups.split_group (pure) -----------------------------------------------------------


SPLIT_CASES = [
    pytest.param(
        RankResources(2000),
        [RankResources(250), RankResources(250), RankResources(1500)],
        [RankResources(250), RankResources(250), RankResources(1500)],
        id="the-same-sum-unchanged",
    ),
    pytest.param(
        RankResources(1000),
        [RankResources(250), RankResources(250), RankResources(1500)],
        [RankResources(125), RankResources(125), RankResources(750)],
        id="halved",
    ),
    pytest.param(
        RankResources(3000),
        [RankResources(500, 1000), RankResources(1000, 2000)],
        [RankResources(1000, 1000), RankResources(2000, 2000)],
        id="doubled-limits-kept",
    ),
    pytest.param(
        RankResources(2),
        [RankResources(1), RankResources(1), RankResources(1000)],
        [RankResources(1), RankResources(1), RankResources(2)],
        id="at-least-1m-each",
    ),
]


@pytest.mark.parametrize(("now", "ranks", "want"), SPLIT_CASES)
def test_split_group(
    now: RankResources, ranks: list[RankResources], want: list[RankResources]
) -> None:
    assert split_group(now, ranks) == want
