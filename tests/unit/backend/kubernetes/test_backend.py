"""KubernetesBackend against FakeKubeApi: the list of API actions each step performs."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import pytest

from rankpack.backend.kubernetes.api.config import KubernetesConfig
from rankpack.backend.kubernetes.api.kubeapi import Obj
from rankpack.backend.kubernetes.backend import KubernetesBackend
from rankpack.backend.kubernetes.nodes.nodereader import CpuCounters, NodeRankReading
from rankpack.backend.kubernetes.nodes.readings import ReadingsMissing
from rankpack.backend.kubernetes.starting import hostmpirun
from rankpack.backend.mpirun import ShimSample
from rankpack.backend.protocol import (
    BackendError,
    LaunchFailed,
    RankPhase,
    RankResources,
    ResizeState,
    SimPhase,
    SimSpec,
    UnknownSimulation,
)
from rankpack.core.failures import FailureCode
from tests.fakeapi import FakeKubeApi

pytestmark = pytest.mark.timeout(20)

SIM = "s1"
POD = f"rankpack-{SIM}-g0"
"""The one group pod of `Harness.spec`'s three ranks (they fit one node, or no node is known)."""
PLACED = ("node-1", "node-1", "node-2")
"""A placement of `Harness.spec`'s ranks on two nodes (`SimSpec.rank_nodes`)."""
PLACED_PODS = [f"rankpack-{SIM}-g0", f"rankpack-{SIM}-g1"]
"""The group pods of a spec placed by `PLACED`: ranks 0 and 1, then rank 2."""


class FakeProc:
    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.env = env
        self.returncode: int | None = None
        self.signals: list[int] = []
        self.done = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.done.wait(timeout)
        assert self.returncode is not None
        return self.returncode

    def kill_group(self, sig: int) -> None:
        self.signals.append(sig)
        self.exit(-sig)

    def exit(self, code: int) -> None:
        self.returncode = code
        self.done.set()


class FakeReadings:
    """The group pods' nodes, as `readings.Readings`: usage by pod uid (each rank of the pod
    the same), nodes that cannot be read, the ranks read, the wait modes and the nice values
    asked for (``nices_refused``: set_nices raises BackendError, as a node that cannot now)."""

    name = "fake"

    def __init__(self) -> None:
        self.by_uid: dict[str, int] = {}
        self.shim: ShimSample | None = None
        self.down: dict[str, str] = {}
        """node -> why it cannot be read."""
        self.modes: list[tuple[str, list[str], str]] = []
        self.reads: list[tuple[str, int]] = []
        """(pod name, rank) of every read."""
        self.nices: list[tuple[str, str, dict[int, int]]] = []
        """(sim, pod name, nices by rank) of every set_nices that succeeded."""
        self.nices_refused: str | None = None

    def prefetch(self, pods: Any) -> None:
        return None

    def read(self, pod: dict[str, Any], rank: int) -> NodeRankReading | None:
        self.reads.append((pod["metadata"]["name"], rank))
        node = pod["spec"].get("nodeName", "")
        if node in self.down:
            raise ReadingsMissing(node, self.down[node])
        ns = self.by_uid.get(pod["metadata"]["uid"])
        return NodeRankReading(CpuCounters(ns, 3, 40), None, self.shim) if ns is not None else None

    def set_wait_mode(self, sim_id: str, pods: Any, mode: str) -> None:
        self.modes.append((sim_id, [p["metadata"]["name"] for p in pods], mode))

    def set_nices(self, sim_id: str, pod: dict[str, Any], nices: Mapping[int, int]) -> None:
        if self.nices_refused is not None:
            raise BackendError(self.nices_refused)
        self.nices.append((sim_id, pod["metadata"]["name"], dict(nices)))


class Harness:
    def __init__(self, tmp_path: Path, api: FakeKubeApi | None = None) -> None:
        self.api = api or FakeKubeApi()
        self.usage = FakeReadings()
        self.procs: list[FakeProc] = []
        self.case = tmp_path / "run"
        self.case.mkdir(exist_ok=True)
        self.backend = self.make()

    def make(self) -> KubernetesBackend:
        return KubernetesBackend(
            self.api,
            KubernetesConfig(kubeconfig=Path("/k"), namespace="rankpack", release_timeout_s=2),
            source=self.usage,
            starter=self.start,
            mpirun="/usr/bin/mpirun",
            background=False,
        )

    def start(self, argv: list[str], cwd: Path, env: dict[str, str], log: IO[bytes]) -> FakeProc:
        log.write(b"Time = 1\n")
        log.flush()
        proc = FakeProc(argv, env)
        self.procs.append(proc)
        return proc

    def spec(self, **kw: Any) -> SimSpec:
        base: dict[str, Any] = {
            "sim_id": SIM,
            "case_dir": self.case,
            "command": ("simpleFoam", "-parallel"),
            "ranks": (RankResources(250), RankResources(250), RankResources(1500)),
            "log_path": self.case / "log.simpleFoam",
        }
        base.update(kw)
        return SimSpec(**base)

    def group_pods(self) -> list[str]:
        """The names of the simulation's group pods in the fake, in group order."""
        prefix = f"rankpack-{SIM}-g"
        names = [name for kind, name in self.api.objects if kind == "pods"]
        return sorted(
            (n for n in names if n.startswith(prefix)), key=lambda n: int(n[len(prefix) :])
        )

    def run_all(self) -> None:
        """Every group pod runs, on its placed node (node-1 when unplaced)."""
        for i, name in enumerate(self.group_pods()):
            node = placed_node(self.api.objects[("pods", name)]) or "node-1"
            self.api.run_pod(name, node=node, ip=f"10.201.0.{10 + i}")
        self.backend.poll_once()


def placed_node(pod: Obj) -> str | None:
    """The node a pod's required node affinity names (`builders.node_affinity`), if any."""
    affinity = pod["spec"].get("affinity")
    if affinity is None:
        return None
    required = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return str(required["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0])


def test_launch_creates_owner_then_service_then_pods(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    assert h.api.actions == [
        # unplaced: the nodes' room first (the ranks share one pod if they fit a node),
        ("list", "resourcequotas"),
        ("list", "nodes"),
        ("list", "pods", "*"),
        # then checked against the namespace before any create (watched from then on: the
        ("list", "limitranges"),  # cache's first Lists, then a round of its watches)
        ("watch", "resourcequotas"),
        ("watch", "limitranges"),
        ("create", "configmaps", "rankpack-s1"),  # one request per object: created, not read
        ("create", "services", "rankpack-s1"),
        ("create", "pods", POD),  # one pod for the three ranks
    ]
    owner_uid = h.api.objects[("configmaps", "rankpack-s1")]["metadata"]["uid"]
    assert h.api.objects[("pods", POD)]["metadata"]["ownerReferences"][0]["uid"] == owner_uid
    assert (h.case / ".rankpack" / "hostfile").read_text().splitlines() == [f"{POD} slots=3"]
    assert (h.case / ".rankpack" / "rsh-agent").stat().st_mode & 0o111
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.PENDING
    assert {r.phase for r in obs.ranks} == {RankPhase.PENDING}


def test_a_placed_launch_creates_a_pod_per_node_in_rank_order(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec(rank_nodes=PLACED))
    assert h.api.actions == [
        ("list", "resourcequotas"),  # (placed: the nodes are not read)
        ("list", "limitranges"),
        ("create", "configmaps", "rankpack-s1"),
        ("create", "services", "rankpack-s1"),
        *[("create", "pods", p) for p in PLACED_PODS],
    ]
    owner_uid = h.api.objects[("configmaps", "rankpack-s1")]["metadata"]["uid"]
    for p, node in zip(PLACED_PODS, ("node-1", "node-2"), strict=True):
        pod = h.api.objects[("pods", p)]
        assert pod["metadata"]["ownerReferences"][0]["uid"] == owner_uid
        assert placed_node(pod) == node
    assert (h.case / ".rankpack" / "hostfile").read_text().splitlines() == [
        f"{PLACED_PODS[0]} slots=2",
        f"{PLACED_PODS[1]} slots=1",
    ]


def test_mpich_on_this_host_runs_hydra_calling_back_on_the_route_to_the_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    towards: list[list[str]] = []

    def address(pods: list[dict[str, Any]]) -> str:
        towards.append([p["status"]["podIP"] for p in pods])
        return "10.201.0.1"

    monkeypatch.setattr(hostmpirun, "address_towards", address)
    h = Harness(tmp_path)
    h.backend.launch(h.spec(mpi="mpich", rank_nodes=PLACED))
    assert (h.case / ".rankpack" / "hostfile").read_text().splitlines() == [
        f"{PLACED_PODS[0]}:2",
        f"{PLACED_PODS[1]}:1",
    ]  # hydra's format
    h.run_all()
    (proc,) = h.procs
    text = " ".join(proc.argv)
    assert "-launcher rsh -launcher-exec " + str(h.case / ".rankpack" / "rsh-agent") in text
    assert "-localhost 10.201.0.1" in text
    assert towards == [["10.201.0.10", "10.201.0.11"]]  # group (so rank) order
    # the default transport: shared memory within a pod, but UCX's cma (ptrace rights)
    assert "-genv UCX_TLS ^cma" in text and "--mca" not in proc.argv
    assert "MPIR_CVAR_NOLOCAL" not in text
    assert proc.env["RANKPACK_NAMESPACE"] == "rankpack"
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in proc.env
    assert h.backend.observe(SIM).phase is SimPhase.RUNNING


def test_the_address_towards_a_pod_is_none_without_one() -> None:
    from rankpack.backend.kubernetes.starting.hostmpirun import address_towards

    assert address_towards([]) is None
    assert address_towards([{"status": {}}]) is None


def test_launch_is_idempotent_across_processes(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.api.actions.clear()
    before = {k: o["metadata"]["uid"] for k, o in h.api.objects.items()}
    again = h.make()  # a second controller process over the same cluster
    again.launch(h.spec())
    # everything exists already: each create is answered 409 and the object taken
    assert {k: o["metadata"]["uid"] for k, o in h.api.objects.items()} == before
    assert [a for a in h.api.writes() if a[0] != "create"] == []
    with pytest.raises(BackendError):
        again.launch(h.spec())  # the same process launching twice is a bug of the caller


def test_someone_elses_object_is_not_taken(tmp_path: Path) -> None:
    api = FakeKubeApi()
    api.create("configmaps", {"metadata": {"name": "rankpack-s1", "labels": {"x": "y"}}})
    h = Harness(tmp_path, api)
    with pytest.raises(LaunchFailed, match="does not belong"):
        h.backend.launch(h.spec())


def test_mpirun_starts_only_when_every_rank_pod_runs(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec(rank_nodes=PLACED))
    h.api.run_pod(PLACED_PODS[0])
    h.backend.poll_once()
    assert h.procs == []
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.PENDING and "rank 2" in obs.reason
    assert "rank 0" not in obs.reason and "rank 1" not in obs.reason
    h.api.run_pod(PLACED_PODS[1], node="node-2", ip="10.201.0.9")
    h.backend.poll_once()
    (proc,) = h.procs
    text = " ".join(proc.argv)
    assert "--mca plm_rsh_agent " + str(h.case / ".rankpack" / "rsh-agent") in text
    assert "--mca btl_tcp_if_include 10.201.0.0/24" in text
    assert proc.env["RANKPACK_NAMESPACE"] == "rankpack"
    assert proc.env["RANKPACK_KUBECONFIG"] == "/k"
    assert "LD_PRELOAD" not in proc.env
    h.usage.by_uid = {h.api.objects[("pods", p)]["metadata"]["uid"]: 10**9 for p in PLACED_PODS}
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.RUNNING
    assert [r.phase for r in obs.ranks] == [RankPhase.RUNNING] * 3
    assert [r.pod for r in obs.ranks] == [PLACED_PODS[0], PLACED_PODS[0], PLACED_PODS[1]]
    assert obs.ranks[2].node == "node-2" and obs.ranks[0].node == "node-1"
    assert obs.ranks[2].allocated == RankResources(1500)
    assert (obs.ranks[0].usage_ns, obs.ranks[0].nr_throttled) == (10**9, 3)
    assert obs.log_text == "Time = 1\n"
    proc.exit(0)
    h.backend.sims[SIM].life.exit_code = None  # the waiter thread may not have run yet
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.SUCCEEDED and obs.exit_code == 0
    assert [r.phase for r in obs.ranks] == [RankPhase.SUCCEEDED] * 3


def test_resize_pending_then_completed_from_status(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec(rank_nodes=PLACED))  # rank 2 alone in its group pod
    h.run_all()
    h.api.actions.clear()
    st = h.backend.resize(SIM, 2, RankResources(750))
    assert st.state is ResizeState.PENDING and (st.from_millis, st.to_millis) == (1500, 750)
    assert h.api.writes() == [("patch", "pods/resize", PLACED_PODS[1])]
    assert h.usage.nices == []  # a group of one rank has no nice values to set
    h.backend.poll_once()
    assert h.backend.observe(SIM).ranks[2].resize.state is ResizeState.PENDING  # type: ignore[union-attr]
    h.api.set_conditions(PLACED_PODS[1], {"type": "PodResizeInProgress", "status": "True"})
    h.backend.poll_once()
    assert h.backend.observe(SIM).ranks[2].resize.state is ResizeState.IN_PROGRESS  # type: ignore[union-attr]
    h.api.settle_resize(PLACED_PODS[1])
    h.backend.poll_once()
    rank = h.backend.observe(SIM).ranks[2]
    assert rank.resize is not None and rank.resize.state is ResizeState.COMPLETED
    assert rank.resize.latency_s is not None and rank.resize.latency_s >= 0
    assert rank.desired == rank.allocated == RankResources(750)


def test_resize_deferred_then_infeasible_is_reported(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    h.backend.resize(SIM, 0, RankResources(900))
    h.api.set_conditions(POD, {"type": "PodResizePending", "status": "True",
                               "reason": "Deferred", "message": "busy"})  # fmt: skip
    h.backend.poll_once()
    r = h.backend.observe(SIM).ranks[0].resize
    assert r is not None and r.state is ResizeState.DEFERRED and r.reason == "busy"
    h.api.set_conditions(POD, {"type": "PodResizePending", "status": "True",
                               "reason": "Infeasible", "message": "too big"})  # fmt: skip
    h.backend.poll_once()
    r = h.backend.observe(SIM).ranks[0].resize
    assert r is not None and r.state is ResizeState.INFEASIBLE and r.latency_s is not None


def test_resize_forbidden_by_the_apiserver_is_rejected_at_once(tmp_path: Path) -> None:
    h = Harness(tmp_path, FakeKubeApi(resize_limit_millis=2000))
    h.backend.launch(h.spec())
    h.run_all()
    st = h.backend.resize(SIM, 1, RankResources(5000))
    assert st.state is ResizeState.REJECTED
    assert "allocatable" in st.reason
    assert h.api.writes()[-2:] == [
        ("patch", "pods/resize", POD),  # the group's sum: 250 + 5000 + 1500
        ("create", "events", POD, "ResizeRejected"),
    ]
    (event,) = h.api.events
    assert event["type"] == "Warning" and "250m -> 5000m" in event["message"]
    obs = h.backend.observe(SIM)
    assert obs.ranks[1].desired == RankResources(250)  # the rank keeps its CPU
    assert obs.phase is SimPhase.RUNNING
    assert h.usage.nices == []  # and its group its nice values


def test_a_deleted_rank_pod_fails_the_simulation(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec(rank_nodes=PLACED))
    h.run_all()
    (proc,) = h.procs
    del h.api.objects[("pods", PLACED_PODS[1])]  # rank 2's; ranks 0 and 1's pod runs on
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED
    assert obs.reason == f"rank pod {PLACED_PODS[1]} was deleted"
    assert obs.failure is FailureCode.POD_DELETED
    assert obs.ranks[2].phase is RankPhase.FAILED
    assert proc.signals  # mpirun was told to end
    h.api.actions.clear()
    h.backend.poll_once()  # the failure is acted on once
    assert h.api.writes() == []
    (event,) = h.api.events
    assert (event["reason"], event["involvedObject"]["name"]) == (
        "SimulationFailed",
        PLACED_PODS[1],
    )


def test_an_evicted_rank_pod_fails_the_simulation(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    h.api.evict(POD)
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and "evicted" in obs.reason
    assert obs.failure is FailureCode.EVICTED


def test_stop_and_release_delete_everything_through_the_owner(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec(rank_nodes=PLACED))
    h.run_all()
    h.api.actions.clear()
    h.backend.release(SIM)
    writes = h.api.writes()
    kill = "/bin/sh -c kill -9 -1 2>/dev/null; true"
    assert sorted(writes[:2]) == [("exec", p, kill) for p in PLACED_PODS]  # one per pod
    assert writes[2:] == [("delete", "configmaps", "rankpack-s1", "Foreground")]
    assert h.api.objects == {}  # the garbage collector took the service and the pods
    assert h.procs[0].signals
    h.backend.release(SIM)  # idempotent
    assert h.api.writes() == writes


def test_list_and_adopt(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec(rank_nodes=PLACED))
    h.run_all()
    h.backend.resize(SIM, 2, RankResources(500))
    later = h.make()
    (ref,) = later.list()
    assert ref.sim_id == SIM and ref.phase is SimPhase.RUNNING
    with pytest.raises(UnknownSimulation):
        later.adopt("nope", h.spec(sim_id="nope"))
    later.adopt(SIM, h.spec(rank_nodes=PLACED))
    later.poll_once()
    obs = later.observe(SIM)
    assert obs.phase is SimPhase.RUNNING
    assert obs.ranks[2].desired == RankResources(500)  # read back from its (own) group pod
    assert [r.desired for r in obs.ranks[:2]] == [RankResources(250)] * 2
    assert [r.pod for r in obs.ranks] == [PLACED_PODS[0], PLACED_PODS[0], PLACED_PODS[1]]
    (h.case / ".rankpack" / "mpirun.exit").write_text("0\n")
    later.poll_once()
    assert later.observe(SIM).phase is SimPhase.SUCCEEDED


def test_inventory_subtracts_every_live_pod(tmp_path: Path) -> None:
    api = FakeKubeApi()
    api.nodes = [
        {"metadata": {"name": "n1"}, "spec": {},
         "status": {"allocatable": {"cpu": "2"},
                    "conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "n2"}, "spec": {"unschedulable": True},
         "status": {"allocatable": {"cpu": "8"},
                    "conditions": [{"type": "Ready", "status": "True"}]}},
    ]  # fmt: skip
    api.other_pods = [
        {"spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {"cpu": "300m"}}}]},
         "status": {"phase": "Running"}},
    ]  # fmt: skip
    h = Harness(tmp_path, api)
    inv = h.backend.inventory()
    assert [(n.name, n.allocatable_millis, n.requested_millis) for n in inv.nodes] == [
        ("n1", 2000, 300)
    ]


def test_a_node_that_is_not_ready_counts_only_towards_what_could_ever_fit(
    tmp_path: Path,
) -> None:
    api = FakeKubeApi()
    api.nodes = [
        {"metadata": {"name": "n1"}, "spec": {},
         "status": {"allocatable": {"cpu": "2"},
                    "conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "lost"}, "spec": {},
         "status": {"allocatable": {"cpu": "4"},
                    "conditions": [{"type": "Ready", "status": "Unknown"}]}},
        {"metadata": {"name": "cordoned"}, "spec": {"unschedulable": True},
         "status": {"allocatable": {"cpu": "8"}, "conditions": []}},
    ]  # fmt: skip
    inv = Harness(tmp_path, api).backend.inventory()
    assert [n.name for n in inv.nodes] == ["n1"]  # placeable now
    assert (inv.allocatable_millis, inv.unready_millis, inv.all_nodes_millis) == (2000, 4000, 6000)


def test_inventory_without_node_access_needs_a_given_capacity(tmp_path: Path) -> None:
    h = Harness(tmp_path, FakeKubeApi(forbid_nodes=True))
    with pytest.raises(BackendError, match="--allocatable"):
        h.backend.inventory()


def test_unknown_simulation(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    with pytest.raises(UnknownSimulation):
        h.backend.observe("nope")
    with pytest.raises(UnknownSimulation):
        h.backend.resize("nope", 0, RankResources(1))


def test_after_release_the_simulation_is_unknown_and_stop_is_a_no_op(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    h.backend.release(SIM)
    h.backend.stop(SIM)
    with pytest.raises(UnknownSimulation):
        h.backend.observe(SIM)
    assert h.backend.list() == ()


def test_resize_of_an_ended_simulation_is_rejected_without_a_call(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    h.backend.stop(SIM)
    h.api.actions.clear()
    st = h.backend.resize(SIM, 0, RankResources(300))
    assert st.state is ResizeState.REJECTED and h.api.actions == []


def test_a_bad_case_is_a_stage_error_in_observe(tmp_path: Path) -> None:
    from rankpack.backend.protocol import StageSpec

    h = Harness(tmp_path)
    h.backend.stage(StageSpec("s2", str(tmp_path / "missing"), 1, tmp_path / "runs"))
    obs = h.backend.observe("s2")
    assert obs.phase is SimPhase.FAILED and obs.stage_error and "does not exist" in obs.stage_error
    assert h.api.actions == []


def test_list_does_not_consume_the_log(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    (ref,) = h.backend.list()
    assert ref.phase is SimPhase.RUNNING
    assert h.backend.observe(SIM).log_text == "Time = 1\n"


def test_inventory_without_node_access_uses_the_given_capacity(tmp_path: Path) -> None:
    import dataclasses

    h = Harness(tmp_path, FakeKubeApi(forbid_nodes=True))
    h.backend.config = dataclasses.replace(h.backend.config, allocatable_millis=2000)
    h.backend.launch(h.spec())
    (node,) = h.backend.inventory().nodes
    assert (node.allocatable_millis, node.requested_millis) == (2000, 2000)
    h.api.actions.clear()
    h.backend.inventory()
    assert ("list", "nodes") not in h.api.actions  # the refusal is remembered


def test_rank_pods_that_never_run_fail_the_simulation(tmp_path: Path) -> None:
    import dataclasses

    h = Harness(tmp_path)
    h.backend.config = dataclasses.replace(h.backend.config, start_timeout_s=0.0)
    h.backend.launch(h.spec())
    pod = h.api.objects[("pods", POD)]
    unscheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    pod["status"]["conditions"] = [unscheduled]
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED
    assert "not running after 0 s" in obs.reason and "Unschedulable" in obs.reason
    assert h.procs == []


def test_a_pod_the_scheduler_cannot_place_fails_its_launch_unschedulable(tmp_path: Path) -> None:
    """Issue 40: not NotRunning after the start timeout, but Unschedulable with the
    scheduler's reason once it has said so for ``unschedulable_s``; a pod that gets a
    node meanwhile starts the count again."""
    import dataclasses

    h = Harness(tmp_path)
    h.backend.config = dataclasses.replace(h.backend.config, unschedulable_s=0.0)
    h.backend.launch(h.spec())
    pod = h.api.objects[("pods", POD)]
    said = "0/2 nodes are available: 2 Insufficient cpu."
    unscheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                   "message": said}  # fmt: skip

    pod["spec"].pop("nodeName", None)  # (the fake places pods; this one found no node)

    def scheduled_as(condition: dict[str, str]) -> None:
        pod["status"]["conditions"] = [condition]
        pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)

    scheduled_as(unscheduled)
    h.backend.poll_once()  # first seen: counted from now
    assert h.backend.observe(SIM).phase is not SimPhase.FAILED
    scheduled_as({"type": "PodScheduled", "status": "False", "reason": "SchedulerError"})
    h.backend.poll_once()  # no longer unschedulable: the count is over
    scheduled_as(unscheduled)
    h.backend.poll_once()
    assert h.backend.observe(SIM).phase is not SimPhase.FAILED
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.UNSCHEDULABLE
    assert f"pod {POD} cannot be scheduled: {said}" in obs.reason
    assert h.procs == []


# -- adoption after a crash mid-launch (the launch marker) ----------------------------------


def test_adopting_a_simulation_whose_mpirun_never_started_starts_it(tmp_path: Path) -> None:
    """The earlier process died after creating the rank pods, before starting mpirun."""
    h = Harness(tmp_path)
    h.backend.launch(h.spec())  # pods created; mpirun not started (they do not run yet)
    later = h.make()
    later.adopt(SIM, h.spec())
    assert later.observe(SIM).phase is SimPhase.PENDING and not h.procs
    h.run_all()
    later.poll_once()
    assert len(h.procs) == 1  # started once, by the adopter
    assert later.observe(SIM).phase is SimPhase.RUNNING


def test_adopting_before_the_pods_exist_creates_them(tmp_path: Path) -> None:
    """The earlier process died after recording the launch, before creating anything."""
    h = Harness(tmp_path)
    h.backend.adopt(SIM, h.spec())
    created = [a for a in h.api.actions if a[0] == "create"]
    assert ("create", "configmaps", "rankpack-s1") in created
    assert [a[2] for a in created if a[1] == "pods"] == [POD]
    h.run_all()
    assert len(h.procs) == 1


def test_adopting_when_some_pods_exist_creates_the_missing_ones(tmp_path: Path) -> None:
    """The earlier process died between creating group 0's pod and group 1's (seen in CI:
    the adopter waited 300 s for a pod nobody would create)."""
    h = Harness(tmp_path)
    h.backend.launch(h.spec(rank_nodes=PLACED))
    del h.api.objects[("pods", PLACED_PODS[1])]
    h.api.actions.clear()
    later = h.make()
    later.adopt(SIM, h.spec(rank_nodes=PLACED))
    assert [a[2] for a in h.api.actions if a[:2] == ("create", "pods")] == [PLACED_PODS[1]]
    h.run_all()
    later.poll_once()
    assert len(h.procs) == 1 and later.observe(SIM).phase is SimPhase.RUNNING


def test_a_running_mpirun_is_never_started_twice(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    assert len(h.procs) == 1  # this process holds the launch lock while mpirun runs
    later = h.make()
    later.adopt(SIM, h.spec())
    later.poll_once()
    assert len(h.procs) == 1 and later.observe(SIM).phase is SimPhase.RUNNING


def test_a_launcher_that_died_without_an_exit_code_fails_the_simulation(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    h.backend.forget_all()  # the launching process is gone: nobody holds the lock
    later = h.make()
    later.adopt(SIM, h.spec())
    later.poll_once()
    obs = later.observe(SIM)
    assert obs.phase is SimPhase.FAILED and "without an exit code" in obs.reason
    assert len(h.procs) == 1


def test_launch_marker_states(tmp_path: Path) -> None:
    from rankpack.backend.kubernetes.starting import exitwrapper

    assert exitwrapper.state(tmp_path) == "never"
    fd = exitwrapper.begin(tmp_path)
    assert fd is not None
    assert exitwrapper.state(tmp_path) == "running"
    assert exitwrapper.begin(tmp_path) is None  # a second launch is refused while it is held
    os.close(fd)
    assert exitwrapper.state(tmp_path) == "never"  # died before the spawn: start it
    fd = exitwrapper.begin(tmp_path)
    assert fd is not None
    exitwrapper.launched(fd, 1234)
    os.close(fd)
    assert exitwrapper.state(tmp_path) == "died"
    (tmp_path / "mpirun.exit").write_text("0\n")
    assert exitwrapper.state(tmp_path) == "ended"


# -- readings from the rank pods' nodes (decision 0010) ---------------------------------------


def _with_shim(h: Harness, monkeypatch: pytest.MonkeyPatch) -> SimSpec:
    from rankpack.backend.protocol import ShimSpec

    lib = h.case.parent / "librankpack_pmpi.openmpi.so"
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setattr("rankpack.profile.shim.shim_library", lambda flavour: lib)
    return h.spec(shim=ShimSpec("spin", "openmpi"))


def test_the_shims_records_are_in_each_rank_pods_own_volume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path)
    h.backend.launch(_with_shim(h, monkeypatch))
    h.run_all()
    (proc,) = h.procs
    assert "-x RANKPACK_SHIM_DIR=/var/run/rankpack " in " ".join(proc.argv)
    assert not (h.case / ".rankpack" / "shim").exists()  # nothing live on the case volume
    assert (h.case / ".rankpack" / "lib" / "librankpack_pmpi.openmpi.so").is_file()
    assert h.backend.placement()["usage"] == "fake"


def test_a_node_that_cannot_be_read_flags_its_ranks_and_warns_once_per_outage(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    h.usage.by_uid = {h.api.objects[("pods", POD)]["metadata"]["uid"]: 10**9}
    h.usage.shim = ShimSample(7, 3, 0.7, "spin")
    obs = h.backend.observe(SIM)
    assert all(r.readings_ok for r in obs.ranks)
    assert obs.ranks[0].compute_ns == 7
    h.usage.by_uid = {k: 2 * 10**9 for k in h.usage.by_uid}
    h.usage.down = {"node-1": "timed out"}
    h.api.actions.clear()
    for _ in range(3):
        obs = h.backend.observe(SIM)
        assert [r.readings_ok for r in obs.ranks] == [False] * 3
        # the last counters, flagged: never the fresh ones it could not read
        assert [r.usage_ns for r in obs.ranks] == [10**9] * 3
        assert obs.ranks[0].compute_ns == 7
    assert h.api.writes() == [("create", "events", POD, "NodeAgentUnreachable")]
    assert "node agent on node-1 unreachable: timed out" in h.api.events[-1]["message"]
    h.usage.down = {}
    obs = h.backend.observe(SIM)
    assert all(r.readings_ok for r in obs.ranks) and obs.ranks[0].usage_ns == 2 * 10**9
    h.usage.down = {"node-1": "connection refused"}
    h.backend.observe(SIM)
    assert [e["reason"] for e in h.api.events] == ["NodeAgentUnreachable"] * 2  # a new outage


def test_wait_modes_are_set_on_the_ranks_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path)
    h.backend.launch(_with_shim(h, monkeypatch))
    with pytest.raises(BackendError, match="not every rank pod runs"):
        h.backend.set_wait_mode(SIM, "polite")
    h.run_all()
    with pytest.raises(BackendError, match="unknown wait mode"):
        h.backend.set_wait_mode(SIM, "nap")
    h.backend.set_wait_mode(SIM, "polite")
    assert h.usage.modes == [(SIM, [POD], "polite")]  # the group pod, once


def test_a_simulation_without_the_shim_has_no_wait_mode(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    with pytest.raises(BackendError, match="without the shim"):
        h.backend.set_wait_mode(SIM, "polite")
    assert h.usage.modes == []


def NoClusterPods() -> FakeKubeApi:
    """An identity that may not list pods cluster-wide (the in-cluster operator)."""
    return FakeKubeApi(forbid_paths={"/api/v1/pods"})


def test_inventory_without_cluster_pods_counts_the_agents_and_room_for_a_launcher(
    tmp_path: Path,
) -> None:
    def pod(ns: str, cpu: str) -> Obj:
        containers = [{"resources": {"requests": {"cpu": cpu}}}]
        return {"metadata": {"namespace": ns}, "spec": {"nodeName": "n1", "containers": containers},
                "status": {"phase": "Running"}}  # fmt: skip

    api = NoClusterPods()
    api.nodes = [{"metadata": {"name": "n1"}, "spec": {},
                  "status": {"allocatable": {"cpu": "2"},
                             "conditions": [{"type": "Ready", "status": "True"}]}}]  # fmt: skip
    # the agent (its namespace is readable), another tenant's pod (it is not: unseen)
    api.other_pods = [pod("rankpack-system", "50m"), pod("elsewhere", "700m")]
    h = Harness(tmp_path, api)
    h.backend.config = replace(h.backend.config, launcher="pod", launcher_cpu_millis=50)
    inv = h.backend.inventory()
    assert [(n.name, n.requested_millis) for n in inv.nodes] == [("n1", 50)]
    assert inv.launch_overhead_millis == 100  # its two containers, 50m each
    h.backend.config = replace(h.backend.config, launcher="host")
    assert h.backend.inventory().launch_overhead_millis == 0
    # issue 40: the node agents count every pod of their node, the unseen tenant's too;
    # the larger of that and what this identity sees is the node's use
    from rankpack.backend.kubernetes.nodes.capacity import ClusterCapacity

    asked: list[list[str]] = []

    def agents_say(nodes: list[str]) -> dict[str, int]:
        asked.append(list(nodes))
        return {"n1": 750, "gone": 5}

    counted = ClusterCapacity(api, h.backend.config, h.backend.cache, node_requests=agents_say)
    assert [(n.name, n.requested_millis) for n in counted.inventory().nodes] == [("n1", 750)]
    assert asked == [["n1"]]
    lagging = ClusterCapacity(api, h.backend.config, h.backend.cache,
                              node_requests=lambda nodes: {"n1": 10})  # fmt: skip
    assert [n.requested_millis for n in lagging.inventory().nodes] == [50]


# -- what it costs the apiserver (issue 29) --------------------------------------------------


def test_following_a_running_simulation_sends_no_request(tmp_path: Path) -> None:
    """Once every collection is listed and watched, rounds of the follower and the loop's
    inventory every tick read the cache: only changes (a resize) cost requests."""
    api = FakeKubeApi()
    api.nodes = [{"metadata": {"name": "node-1"}, "spec": {},
                  "status": {"allocatable": {"cpu": "2"},
                             "conditions": [{"type": "Ready", "status": "True"}]}}]  # fmt: skip
    h = Harness(tmp_path, api)
    h.backend.launch(h.spec())
    h.run_all()
    h.backend.inventory()
    lists = [a for a in api.actions if a[0] == "list"]
    assert len(set(lists)) == len(lists)  # every collection listed once
    before = len(api.actions)
    for _ in range(20):  # twenty ticks
        h.backend.poll_once()
        h.backend.inventory()
        h.backend.observe(SIM)
    # (without threads, each read of the cache is one round of its watch: the fake's
    # watches answer at once; a real one stays open for minutes)
    assert {a[0] for a in api.actions[before:]} == {"watch"}
    before = len(api.actions)
    h.backend.resize(SIM, 2, RankResources(750))
    h.api.settle_resize(POD)
    h.backend.poll_once()
    assert h.backend.observe(SIM).ranks[2].resize.state is ResizeState.COMPLETED  # type: ignore[union-attr]
    assert [a for a in api.actions[before:] if a[0] != "watch"] == [("patch", "pods/resize", POD)]


def test_a_watch_answered_gone_lists_again_once(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    h.backend.poll_once()
    path = "/api/v1/namespaces/rankpack/pods"
    h.api.gone.add(path)
    h.run_all()  # the next watch is answered 410: the pods are listed again
    # (the namespace's pods; the launch's look at the nodes' room listed every namespace's)
    assert [a for a in h.api.actions if a[:2] == ("list", "pods")] == [
        ("list", "pods", "*"),
        ("list", "pods"),
        ("list", "pods"),
    ]
    assert len(h.procs) == 1  # and the round went on from the fresh List
    assert h.backend.cache.stats()[path]["gone"] == 1
