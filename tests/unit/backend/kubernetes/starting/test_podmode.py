"""Pod mode (mpirun in a launcher pod per simulation) against FakeKubeApi: the launcher
pod's builder, its identity, and the backend following it (no process, no pods/exec)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.api.config import (
    DEV_IMAGE,
    HostPathVolume,
    KubernetesConfig,
    PvcVolume,
    VolumeSource,
)
from rankpack.backend.kubernetes.backend import KubernetesBackend
from rankpack.backend.kubernetes.objects import builders, keyed, launcherpods, rbac
from rankpack.backend.kubernetes.objects.groups import RankGroup
from rankpack.backend.kubernetes.record import SimRecord
from rankpack.backend.kubernetes.starting import exitwrapper, podmode
from rankpack.backend.kubernetes.starting.instructions import Instructions
from rankpack.backend.protocol import BackendError, RankPhase, SimPhase
from rankpack.core.failures import FailureCode
from rankpack.errors import UserError
from tests.fakeapi import FakeKubeApi
from tests.unit.backend.kubernetes._helpers import CASE, sim_spec
from tests.unit.backend.kubernetes.test_backend import PLACED, PLACED_PODS, POD, SIM, Harness

pytestmark = pytest.mark.timeout(20)

LAUNCHER = f"rankpack-{SIM}-launcher"
IMAGE = "rankpack.local/rank:dev"


# -- the launcher pod's builder ----------------------------------------------------------------

LABELS = {"rankpack.dev/run-id": "7", "rankpack.dev/rank": "0"}
OWNER = builders.OwnerRef("rankpack-s1", "uid-1")
OPTIONS = launcherpods.LauncherOptions("{}", "rankpack-s1-g0 slots=1\n", "rankpack-launcher")


BUILDS: list[tuple[str, str, VolumeSource, dict[str, str], bool, str]] = [
    # name, image, volume, placement, runAsNonRoot expected, mount path
    ("real-image-pvc", "registry.example/rankpack/rank:1", PvcVolume("runs", Path("/runs")), {},
     True, "/runs"),
    ("local-image-host", IMAGE, HostPathVolume(Path("/runs")), {"kubernetes.io/hostname": "n1"},
     True, "/runs"),
    ("dev-image", DEV_IMAGE, HostPathVolume(CASE), {}, False, str(CASE)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "image", "volume", "placement", "non_root", "mount"), BUILDS,
                         ids=[b[0] for b in BUILDS])  # fmt: skip
def test_launcher_pod_builder(
    name: str,
    image: str,
    volume: VolumeSource,
    placement: dict[str, str],
    non_root: bool,
    mount: str,
) -> None:
    s = sim_spec(labels=LABELS, placement=placement)
    pod = launcherpods.launcher_pod(s, OWNER, volume, image, OPTIONS)
    rank = builders.rank_pod(s, 0, OWNER, volume, image)
    meta, ps = pod["metadata"], pod["spec"]
    # prepare and the launcher start together (no init container: the kubelet would notice
    # its end up to a second later, on every launch)
    assert "initContainers" not in ps
    init, c = ps["containers"]
    assert (init["name"], c["name"]) == ("prepare", "launcher")
    assert meta["annotations"] == {"kubectl.kubernetes.io/default-container": "launcher"}
    assert meta["name"] == "rankpack-s1-launcher"
    assert meta["labels"] == {
        "rankpack.dev/run-id": "7",
        "app.kubernetes.io/managed-by": "rankpack",
        "rankpack.dev/sim": "s1",
        "rankpack.dev/role": "launcher",
    }  # never a rank label: no rank listing takes it for a rank
    assert meta["ownerReferences"] == [OWNER.reference()]
    assert ps["serviceAccountName"] == "rankpack-launcher"
    # its token is mounted in the prepare container alone (rankpack's code, which reads pods);
    # the launcher container runs the image's mpirun with none, like the ranks
    assert ps["automountServiceAccountToken"] is False
    assert rank["spec"]["automountServiceAccountToken"] is False
    (token,) = [v for v in ps["volumes"] if v["name"] == launcherpods.TOKEN_VOLUME]
    sources = token["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    assert {"name": launcherpods.TOKEN_VOLUME, "mountPath": launcherpods.TOKEN_DIR,
            "readOnly": True} in init["volumeMounts"]  # fmt: skip
    assert launcherpods.TOKEN_VOLUME not in {m["name"] for m in c["volumeMounts"]}
    assert ps["restartPolicy"] == "Never"
    assert ps["terminationGracePeriodSeconds"] == launcherpods.LAUNCHER_GRACE_S
    assert ps.get("nodeSelector") == (placement or None)
    assert init["image"] == c["image"] == image  # (no tools_image: the simulation's)
    assert c["workingDir"] == init["workingDir"] == str(CASE)
    # no shell: the entry points and the instructions' path (the owner's, not the run
    # directory's: no rank can change them), nothing else
    assert init["command"] == ["rankpack-launcher", "/etc/rankpack/sim/launch.json",
                               "/rankpack/launch"]  # fmt: skip
    assert c["command"] == [f"{CASE}/.rankpack/bin/rankpack-launch",
                            "/rankpack/launch/launch.json"]  # fmt: skip
    assert "args" not in c and "args" not in init
    assert c["resources"] == init["resources"] == {"requests": {"cpu": "50m"}}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    # its own run directory only (a subPath of the volume), as in the rank pods
    assert mounts["case"] == str(CASE) == rank["spec"]["containers"][0]["volumeMounts"][0][
        "mountPath"]  # fmt: skip
    assert str(CASE).startswith(mount)
    # the rank pods' volumes but their own rankpack-live (the shim's records: ranks only),
    # the owner's key, this pod's launch directory and the token
    rank_volumes = [v for v in rank["spec"]["volumes"] if v["name"] != builders.LIVE_VOLUME]
    own = (keyed.KEY_VOLUME, launcherpods.LAUNCH_VOLUME, launcherpods.TOKEN_VOLUME)
    assert [v for v in ps["volumes"] if v["name"] not in own] == rank_volumes
    assert {"name": launcherpods.LAUNCH_VOLUME, "emptyDir": {}} in ps["volumes"]
    assert {"name": launcherpods.LAUNCH_VOLUME, "mountPath": "/rankpack/launch"} in init[
        "volumeMounts"]  # fmt: skip
    assert {"name": launcherpods.LAUNCH_VOLUME, "mountPath": "/rankpack/launch",
            "readOnly": True} in c["volumeMounts"]  # fmt: skip
    # and from the owner, read-only, the simulation's key (it enters its rank pods with it,
    # no exec), its instructions and the hostfile
    (key,) = [v for v in ps["volumes"] if v["name"] == keyed.KEY_VOLUME]
    assert key["configMap"]["name"] == OWNER.name
    assert [i["key"] for i in key["configMap"]["items"]] == ["key", "launch.json", "hostfile"]
    for container in (init, c):
        (key_mount,) = [m for m in container["volumeMounts"] if m["name"] == keyed.KEY_VOLUME]
        assert key_mount == {"name": keyed.KEY_VOLUME, "mountPath": "/etc/rankpack/sim",
                             "readOnly": True}  # fmt: skip
        security = container["securityContext"]
        assert {k: v for k, v in security.items() if k != "runAsNonRoot"} == (
            builders.CONTAINER_SECURITY)  # fmt: skip
        assert security.get("runAsNonRoot", False) is non_root
        assert container["terminationMessagePath"] == builders.TERMINATION_LOG
        assert container["env"][0] == {
            "name": "RANKPACK_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}
        }  # fmt: skip
        assert (container.get("imagePullPolicy") == "Never") is image.startswith("rankpack.local/")


def test_the_prepare_container_runs_rankpacks_image_and_the_launcher_the_simulations() -> None:
    tools = "registry.example/rankpack/rank:1"
    opts = launcherpods.LauncherOptions("{}", "", "rankpack-launcher", tools_image=tools)
    s = sim_spec()
    pod = launcherpods.launcher_pod(s, OWNER, HostPathVolume(CASE), "registry.example/cfd/foam:12",
                                    opts)  # fmt: skip
    init, c = pod["spec"]["containers"]
    assert (init["image"], c["image"]) == (tools, "registry.example/cfd/foam:12")


def test_launcher_env_and_request_are_configured() -> None:
    env = (("KUBERNETES_SERVICE_HOST", "10.200.0.1"),)
    config = KubernetesConfig(launcher="pod", launcher_cpu_millis=20, launcher_env=env)
    spec = sim_spec(labels=LABELS)
    group = RankGroup(0, None, tuple(range(len(spec.ranks))))
    sim = SimRecord(spec=spec, image=IMAGE, volume=HostPathVolume(CASE),
                    desired=list(spec.ranks), groups=(group,), in_pod=True)  # fmt: skip
    opts = podmode.options(sim, config, "rankpack")
    assert Instructions.parse(opts.instructions).pods == ("rankpack-s1-g0",)
    assert opts.hostfile == f"rankpack-s1-g0 slots={len(spec.ranks)}\n"
    _, c = launcherpods.launcher_pod(
        sim_spec(labels=LABELS), OWNER, HostPathVolume(CASE), IMAGE, opts
    )["spec"]["containers"]
    assert {"name": "KUBERNETES_SERVICE_HOST", "value": "10.200.0.1"} in c["env"]
    # no CPU limit; memory and ephemeral storage bounded (the user's mpirun runs there)
    assert c["resources"] == {
        "requests": {"cpu": "20m", "memory": "128Mi", "ephemeral-storage": "64Mi"},
        "limits": {"memory": "1024Mi", "ephemeral-storage": "1024Mi"},
    }


@pytest.mark.parametrize(("sim_id", "ok"), [("s1", True), ("x" * 45, True), ("x" * 46, False)])
def test_launcher_pod_names_are_dns_labels(sim_id: str, ok: bool) -> None:
    if ok:
        builders.check_launcher_name(sim_id)
    else:
        with pytest.raises(BackendError, match="launcher pod"):
            builders.check_launcher_name(sim_id)


def test_the_launcher_mode_is_checked() -> None:
    with pytest.raises(UserError, match="launcher"):
        KubernetesConfig(launcher="cluster")  # type: ignore[arg-type]


# -- RBAC ------------------------------------------------------------------------------------------


def test_the_launchers_rights_are_reading_pods_only() -> None:
    grants = {(res, verb) for _, resources, verbs in rbac.LAUNCHER_RULES
              for res in resources for verb in verbs}  # fmt: skip
    # no pods/exec: it enters its own rank pods with its simulation's key (decision 0013)
    assert grants == {("pods", "get"), ("pods", "list"), ("pods", "watch")}
    sa, role, binding = rbac.launcher_rbac("sims")
    assert (sa["kind"], sa["metadata"]["name"], sa["metadata"]["namespace"]) == (
        "ServiceAccount", "rankpack-launcher", "sims"
    )  # fmt: skip
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "sims"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "rankpack-launcher"}  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rankpack-launcher",
                                    "namespace": "sims"}]  # fmt: skip
    assert rbac.launcher_rbac()[2]["subjects"][0]["namespace"] == rbac.DEPLOY_NAMESPACE
    assert "namespace" not in rbac.launcher_rbac()[0]["metadata"]


def test_the_rank_pods_identity_has_no_token_and_host_mode_keeps_the_default() -> None:
    sa = rbac.rank_service_account("sims")
    assert sa["automountServiceAccountToken"] is False
    assert (sa["metadata"]["name"], sa["metadata"]["namespace"]) == (rbac.RANK_SERVICE_ACCOUNT,
                                                                     "sims")  # fmt: skip
    assert (
        "serviceAccountName"
        not in builders.rank_pod(sim_spec(labels=LABELS), 0, OWNER, PvcVolume("r", CASE), IMAGE)[
            "spec"
        ]
    )


def test_the_operator_in_pod_mode_needs_no_exec() -> None:
    assert [r for r in rbac.RULES if "pods/exec" not in r[1]] == list(rbac.OPERATOR_RULES)
    assert not any("pods/exec" in r["resources"] for r in rbac.operator_role_rules())
    assert len(rbac.OPERATOR_RULES) == len(rbac.RULES) - 1


# -- the backend in pod mode ---------------------------------------------------------------------


class PodHarness(Harness):
    def make(self) -> KubernetesBackend:
        backend = super().make()
        backend.config = dataclasses.replace(backend.config, launcher="pod", image=IMAGE)
        return backend

    def launcher(self) -> dict[str, Any]:
        return self.api.objects[("pods", LAUNCHER)]

    def owner_file(self, item: str) -> str:
        """What the owner ConfigMap gives the launcher pod (`keyed.launcher_volume`)."""
        data: dict[str, str] = self.api.objects[("configmaps", f"rankpack-{SIM}")]["data"]
        return data[item]

    def set_launcher(self, phase: str, state: dict[str, Any], **status: Any) -> None:
        pod = self.launcher()
        pod["spec"]["nodeName"] = "node-1"
        pod["status"] = {
            "phase": phase,
            "podIP": "10.201.0.30",
            "containerStatuses": [{"name": "launcher", "restartCount": 0, "state": state}],
            **status,
        }
        pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)

    def run_launcher(self) -> None:
        self.set_launcher("Running", {"running": {"startedAt": "now"}})

    def end_launcher(self, code: int, message: str = "", reason: str = "Completed") -> None:
        terminated = {"exitCode": code, "reason": reason, "message": message}
        self.set_launcher("Succeeded" if code == 0 else "Failed", {"terminated": terminated})

    def running(self, **spec: Any) -> None:
        """Launched (``spec``: its fields to change); every rank pod and the launcher run."""
        self.backend.launch(self.spec(**spec))
        self.run_launcher()
        self.run_all()

    @property
    def exit_file(self) -> Path:
        return self.case / ".rankpack" / "mpirun.exit"

    def no_exec(self) -> None:
        assert not [a for a in self.api.actions if a[0] == "exec"]
        assert self.procs == []  # nothing started on this host


def test_launch_creates_the_launcher_pod_after_the_rank_pods(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.backend.launch(h.spec(rank_nodes=PLACED))
    created = [a[2] for a in h.api.writes() if a[:2] == ("create", "pods")]
    assert created == [*PLACED_PODS, LAUNCHER]
    assert h.launcher()["spec"]["serviceAccountName"] == "rankpack-launcher"
    # the rank pods' own identity (deploy/ installs it): no rights, no token
    for name in PLACED_PODS:
        pod = h.api.objects[("pods", name)]["spec"]
        assert pod["serviceAccountName"] == rbac.RANK_SERVICE_ACCOUNT
        assert pod["automountServiceAccountToken"] is False
    ins = Instructions.parse(h.owner_file("launch.json"))
    # nothing the launcher reads or runs is on the run directory, which the ranks may write
    assert not (h.case / ".rankpack" / "launch.json").exists()
    assert str(ins.hostfile) == "/etc/rankpack/sim/hostfile"
    assert (
        ins.pods == tuple(PLACED_PODS) and ins.namespace == "rankpack" and ins.container == "rank"
    )
    assert ins.ranks == ins.n_ranks == 3  # ranks, not pods: mpirun's -np
    assert ins.exit_path == h.exit_file and ins.log_path == h.case / "log.simpleFoam"
    launcher = str(h.case / ".rankpack" / "rank-launcher")
    assert ins.command == ("/bin/sh", launcher, "simpleFoam", "-parallel") and ins.subnet is None
    # within its own group: 250m beside 250m, 1500m alone (all three together: 12,12,0)
    assert ins.env["RANKPACK_RANK_NICE"] == "0,0,0"
    assert ins.start_timeout_s == h.backend.config.start_timeout_s
    assert (h.case / ".rankpack" / "hostfile").read_text().splitlines() == [
        f"{PLACED_PODS[0]} slots=2",
        f"{PLACED_PODS[1]} slots=1",
    ]
    assert h.backend.placement()["launcher"] == "launcher-pod"
    h.api.actions.clear()
    uids = {k: o["metadata"]["uid"] for k, o in h.api.objects.items()}
    h.make().launch(h.spec(rank_nodes=PLACED))  # idempotent across processes: 409s taken
    assert {k: o["metadata"]["uid"] for k, o in h.api.objects.items()} == uids
    assert [a for a in h.api.writes() if a[0] != "create"] == []


def test_the_simulation_starts_when_the_launcher_and_every_rank_pod_run(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()  # the ranks run, the launcher does not yet
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.PENDING and f"launcher pod {LAUNCHER}: Pending" in obs.reason
    h.run_launcher()
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.RUNNING
    assert [r.phase for r in obs.ranks] == [RankPhase.RUNNING] * 3  # the launcher is no rank
    assert [r.pod for r in obs.ranks] == [POD] * 3
    h.no_exec()


def test_the_end_comes_from_the_exit_file(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.running()
    h.exit_file.write_text("0\n")
    h.end_launcher(0)
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.SUCCEEDED and obs.exit_code == 0
    assert [r.phase for r in obs.ranks] == [RankPhase.SUCCEEDED] * 3
    h.no_exec()


def test_the_exit_file_ends_it_before_the_kubelet_shows_the_launcher_ended(
    tmp_path: Path,
) -> None:
    h = PodHarness(tmp_path)
    h.running()
    h.backend.poll_once()
    assert h.backend.observe(SIM).phase is SimPhase.RUNNING  # no exit file: it runs
    h.exit_file.write_text("3\n")  # rankpack-launch, as mpirun ended; the pod still runs
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.exit_code == 3
    h.exit_file.write_text("garbage")  # (read once: a later write changes nothing)
    h.backend.poll_once()
    assert h.backend.observe(SIM).exit_code == 3


def test_an_exit_file_that_does_not_parse_leaves_it_running(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.running()
    h.exit_file.write_text("not a code")
    h.backend.poll_once()
    assert h.backend.observe(SIM).phase is SimPhase.RUNNING


def test_without_an_exit_file_the_containers_code_is_mpiruns(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.running()
    h.end_launcher(1, reason="Error")
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.exit_code == 1
    assert obs.failure is FailureCode.SOLVER_FAILED
    assert h.exit_file.read_text() == "1\n"  # written for `list` and a later adopter


def test_a_launcher_that_failed_before_mpirun_says_why(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.running()
    h.end_launcher(2, "rank pods not running after 300 s: x", reason="Error")
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.LAUNCH_FAILED
    assert obs.reason == f"launcher pod {LAUNCHER}: rank pods not running after 300 s: x"
    assert ("pods", LAUNCHER) in h.api.objects  # left to read until release


HOW_LOST = ("deleted", "deleting", "evicted", "failed-evicted", "node-gone", "node-lost",
            "node-came-back")  # fmt: skip
CONTAINER_GONE = "The container could not be located when the pod was terminated"


@pytest.mark.parametrize("how", HOW_LOST)
def test_a_lost_launcher_pod_fails_the_simulation(tmp_path: Path, how: str) -> None:
    """Lost by someone's hand: ``LauncherLost``; lost with its node (gone, lost, or back
    without its container): ``NodeLost``, which the loop requeues to resume."""
    h = PodHarness(tmp_path)
    h.running()
    pod = h.launcher()
    if how == "deleted":
        del h.api.objects[("pods", LAUNCHER)]
    elif how == "deleting":
        pod["metadata"]["deletionTimestamp"] = "now"
    elif how in ("evicted", "node-gone"):
        reason = "EvictionByEvictionAPI" if how == "evicted" else "DeletionByPodGC"
        pod["status"]["conditions"] = [
            {"type": "DisruptionTarget", "status": "True", "reason": reason}
        ]
    elif how == "node-lost":
        pod["status"].update(phase="Failed", reason="NodeLost", message="node went away")
    elif how == "node-came-back":
        h.end_launcher(137, CONTAINER_GONE, reason="ContainerStatusUnknown")
        pod = h.launcher()
    else:
        pod["status"].update(phase="Failed", reason="Evicted", message="low on memory")
    pod["metadata"]["resourceVersion"] = "99"
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    node = how in ("node-gone", "node-lost", "node-came-back")
    want = FailureCode.NODE_LOST if node else FailureCode.LAUNCHER_LOST
    assert obs.phase is SimPhase.FAILED and obs.failure is want
    assert obs.reason.startswith(f"launcher pod {LAUNCHER} ")
    assert ("pods", LAUNCHER) not in h.api.objects or how != "deleted"
    h.backend.poll_once()  # acted on once, nothing hangs
    assert h.backend.observe(SIM).phase is SimPhase.FAILED
    h.no_exec()


def _init_state(
    h: PodHarness, state: dict[str, Any], phase: str = "Pending", layout: str = "containers"
) -> None:
    """The launcher pod while (or after) its prepare container runs: beside it, the launcher
    container runs (``rankpack-launch`` waits for its spec); in a pod an older operator
    made (``layout`` "init"), prepare is an init container and the launcher container waits
    (PodInitializing)."""
    prepare = {"name": "prepare", "restartCount": 0, "state": state}
    if layout == "init":
        h.set_launcher(phase, {"waiting": {"reason": "PodInitializing"}},
                       initContainerStatuses=[prepare])  # fmt: skip
        return
    if phase == "Pending":
        phase = "Running"
    h.set_launcher(phase, {"running": {"startedAt": "now"}})
    h.launcher()["status"]["containerStatuses"].insert(0, prepare)


INIT_ENDS = [
    # name, its terminated state, code, reason starts
    ("said-why", {"exitCode": 2, "reason": "Error",
                  "message": "rank pods not running after 300 s: g0: Pending"},
     FailureCode.LAUNCH_FAILED, "rank pods not running after 300 s"),
    ("silent", {"exitCode": 1, "reason": "Error"}, FailureCode.LAUNCH_FAILED,
     "its prepare container exited 1 before mpirun ran"),
    ("node-came-back", {"exitCode": 137, "reason": "ContainerStatusUnknown",
                        "message": CONTAINER_GONE},
     FailureCode.NODE_LOST, "was lost with its node"),
    ("oom", {"exitCode": 137, "reason": "OOMKilled"}, FailureCode.OOM_KILLED, "was OOM-killed"),
]  # fmt: skip


@pytest.mark.parametrize("layout", ["containers", "init"])
@pytest.mark.parametrize(("name", "terminated", "code", "says"), INIT_ENDS,
                         ids=[e[0] for e in INIT_ENDS])  # fmt: skip
def test_a_prepare_container_that_failed_fails_the_simulation_saying_why(
    tmp_path: Path,
    name: str,
    terminated: dict[str, Any],
    code: FailureCode,
    says: str,
    layout: str,
) -> None:
    h = PodHarness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    _init_state(h, {"running": {"startedAt": "now"}}, layout=layout)
    h.backend.poll_once()
    assert h.backend.observe(SIM).phase is SimPhase.PENDING  # it waits for the ranks
    _init_state(h, {"terminated": terminated}, phase="Failed", layout=layout)
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is code, obs
    assert obs.reason.startswith(f"launcher pod {LAUNCHER}") and says in obs.reason, obs.reason


def test_an_init_container_that_ended_well_is_followed_by_the_launcher(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    _init_state(h, {"terminated": {"exitCode": 0, "reason": "Completed"}}, layout="init")
    h.backend.poll_once()
    assert h.backend.observe(SIM).phase is SimPhase.PENDING
    h.run_launcher()
    h.backend.poll_once()
    assert h.backend.observe(SIM).phase is SimPhase.RUNNING


def test_the_simulation_starts_when_its_prepare_container_has_ended_well(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    _init_state(h, {"running": {"startedAt": "now"}})
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.PENDING and "prepare container waits" in obs.reason, obs
    _init_state(h, {"terminated": {"exitCode": 0, "reason": "Completed"}})
    h.backend.poll_once()
    assert h.backend.observe(SIM).phase is SimPhase.RUNNING


def test_an_init_image_that_cannot_be_pulled_fails_the_simulation(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    _init_state(h, {"waiting": {"reason": "ErrImagePull", "message": "not found"}})
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.CANNOT_START
    assert "cannot start: ErrImagePull: not found" in obs.reason


def test_a_launcher_that_cannot_start_fails_the_simulation(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.backend.launch(h.spec())
    h.run_all()
    waiting = {"reason": "ErrImageNeverPull", "message": "image not present"}
    h.set_launcher("Pending", {"waiting": waiting})
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.CANNOT_START
    assert f"launcher pod {LAUNCHER} cannot start: ErrImageNeverPull" in obs.reason
    assert ("delete", "pods", LAUNCHER, "Background") in h.api.writes()


def test_a_launcher_pod_that_never_runs_times_out(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.backend.config = dataclasses.replace(h.backend.config, start_timeout_s=0.0)
    h.backend.launch(h.spec())
    h.run_all()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.NOT_RUNNING
    assert f"launcher pod {LAUNCHER}: Pending" in obs.reason
    assert ("delete", "pods", LAUNCHER, "Background") in h.api.writes()  # it never starts


def test_a_failed_rank_pod_takes_the_launcher_pod_down(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.running()
    h.api.evict(POD)
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.EVICTED
    assert ("pods", LAUNCHER) not in h.api.objects  # SIGTERM reached mpirun
    h.no_exec()


def test_stop_deletes_the_launcher_pod_and_release_everything(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.running()
    h.api.actions.clear()
    h.backend.stop(SIM)
    assert h.api.writes() == [("delete", "pods", LAUNCHER, "Background")]
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.STOPPED
    h.backend.release(SIM)
    assert h.api.writes()[1:] == [("delete", "configmaps", "rankpack-s1", "Foreground")]
    assert h.api.objects == {}
    h.no_exec()


def test_a_stop_before_it_started_also_deletes_the_launcher(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.backend.launch(h.spec())
    h.backend.stop(SIM)
    assert ("pods", LAUNCHER) not in h.api.objects
    assert h.backend.observe(SIM).failure is FailureCode.STOPPED


def test_the_first_listing_after_creation_may_miss_it(tmp_path: Path) -> None:
    """The poller lists, then creates what a transient error left missing: the launcher
    pod is not in that listing, and must not count as lost."""
    h = PodHarness(tmp_path)
    h.backend.launch(h.spec())
    sim = h.backend.sims[SIM]
    del h.api.objects[("pods", LAUNCHER)]
    assert podmode.follow(sim, None, ranks_running=True) is False
    assert sim.life.failure is None
    podmode.follow(sim, None, ranks_running=True)  # missing again: deleted
    assert sim.life.failure is not None and sim.life.failure.code is FailureCode.LAUNCHER_LOST


# -- adoption in pod mode -------------------------------------------------------------------------


def test_adopting_a_running_simulation_follows_its_launcher_pod(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.running()
    later = h.make()
    later.adopt(SIM, h.spec())
    later.poll_once()
    assert later.observe(SIM).phase is SimPhase.RUNNING
    h.exit_file.write_text("0\n")
    h.end_launcher(0)
    later.poll_once()
    obs = later.observe(SIM)
    assert obs.phase is SimPhase.SUCCEEDED and obs.exit_code == 0
    h.no_exec()


def test_adopting_when_the_launcher_pod_is_gone_is_lost(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.running()
    marker = exitwrapper.begin(h.case / ".rankpack")  # the launcher took the marker and died
    assert marker is not None
    exitwrapper.launched(marker, 7)
    os.close(marker)
    h.backend.forget_all()
    del h.api.objects[("pods", LAUNCHER)]
    later = h.make()
    later.adopt(SIM, h.spec())
    obs = later.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.LAUNCHER_LOST
    assert LAUNCHER in obs.reason and "never written" in obs.reason


def test_adopting_a_simulation_that_ended_reads_its_exit_file(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.running()
    h.exit_file.write_text("3\n")
    h.end_launcher(3, reason="Error")
    later = h.make()
    later.adopt(SIM, h.spec())
    obs = later.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.exit_code == 3
    assert obs.failure is FailureCode.SOLVER_FAILED


def test_adopting_a_launcher_its_stopped_node_lost_is_node_lost(tmp_path: Path) -> None:
    """The operator went down with the launcher's node; the node came back without the
    container, and the next operator adopts the run: lost with its node, not a failed
    launch (the loop requeues it to resume)."""
    h = PodHarness(tmp_path)
    h.running()
    h.backend.forget_all()
    h.end_launcher(137, CONTAINER_GONE, reason="ContainerStatusUnknown")
    later = h.make()
    later.adopt(SIM, h.spec())
    later.poll_once()
    obs = later.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.NODE_LOST
    assert "lost with its node" in obs.reason


def test_adopting_before_the_launcher_pod_exists_creates_it(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.backend.launch(h.spec())
    # the earlier process died after creating the owner, before the launcher pod
    del h.api.objects[("pods", LAUNCHER)]
    later = h.make()
    later.adopt(SIM, h.spec())
    assert ("pods", LAUNCHER) in h.api.objects
    assert json.loads(h.owner_file("launch.json"))["sim_id"] == SIM
    h.run_launcher()
    h.run_all()
    later.poll_once()
    assert later.observe(SIM).phase is SimPhase.RUNNING
    h.no_exec()


def test_host_mode_is_unchanged(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.backend.launch(h.spec())
    assert ("pods", LAUNCHER) not in h.api.objects
    assert not (h.case / ".rankpack" / "launch.json").exists()
    h.run_all()
    assert len(h.procs) == 1
    assert h.backend.placement()["launcher"] == "mpirun+pods/exec"


def test_an_mpi_the_backend_cannot_launch_is_refused_before_anything_is_created(
    tmp_path: Path,
) -> None:
    from rankpack.backend.protocol import LaunchFailed

    h = PodHarness(tmp_path, FakeKubeApi())
    with pytest.raises(LaunchFailed, match="intelmpi"):
        h.backend.launch(h.spec(mpi="intelmpi"))
    assert h.api.writes() == []


def test_mpich_in_a_pod_gets_its_hostfile_and_instructions(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.backend.config = dataclasses.replace(h.backend.config, mpi_transport="auto")
    h.backend.launch(h.spec(mpi="mpich"))
    ins = Instructions.parse(h.owner_file("launch.json"))
    assert (ins.mpi, ins.transport) == ("mpich", "auto")
    assert h.owner_file("hostfile").splitlines() == [f"{POD}:3"]
    assert (ins.pods, ins.n_ranks) == ((POD,), 3)
