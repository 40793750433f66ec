"""The launcher pod's init container (`launcher`) without a cluster or processes: its
instructions (bad input refused), the subnet, waiting for the rank pods on a fake API and
virtual time, and what it writes for ``rankpack-launch`` (whose own run, with a real mpirun
stand-in, is ``tools/launch``'s Go test and tests/integration/test_tools.py)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.api.kubeapi import ApiError
from rankpack.backend.kubernetes.starting import exitwrapper, launcher
from rankpack.backend.kubernetes.starting.instructions import Instructions, InstructionsError
from rankpack.backend.kubernetes.starting.launcher import LaunchError, Preparation, Stopped
from tests.fakeapi import FakeKubeApi
from tests.fakeclock import FakeClock

SIM = "s1"
PODS = tuple(f"rankpack-{SIM}-g{i}" for i in range(3))
"""The group pods of `instructions` (a rank each unless ``ranks`` says more)."""


def instructions(case: Path, **kw: Any) -> Instructions:
    base: dict[str, Any] = {
        "sim_id": SIM,
        "namespace": "rankpack",
        "container": "rank",
        "pods": PODS,
        "hostfile": case / ".rankpack" / "hostfile",
        "case_dir": case,
        "command": ("simpleFoam", "-parallel"),
        "env": {"WM_PROJECT_DIR": "/usr/share/openfoam", "OMPI_MCA_mpi_yield_when_idle": "1"},
        "log_path": case / "log.simpleFoam",
        "exit_path": case / ".rankpack" / "mpirun.exit",
        "start_timeout_s": 30.0,
        "poll_s": 1.0,
        "subnet": None,
    }
    base.update(kw)
    return Instructions(**base)


# -- the instructions ------------------------------------------------------------------------


def test_instructions_round_trip() -> None:
    ins = instructions(Path("/runs/r1"), subnet="10.201.0.0/24", ranks=3)
    assert Instructions.parse(ins.to_json()) == ins
    grouped = instructions(Path("/runs/r1"), ranks=7)  # three group pods, seven ranks
    assert Instructions.parse(grouped.to_json()) == grouped and grouped.n_ranks == 7


def _data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(instructions(Path("/runs/r1")).to_json())
    return data


BAD: list[tuple[str, Any]] = [
    ("not-json", "{"),
    ("a-list", []),
    ("missing-key", {k: v for k, v in _data().items() if k != "exit_path"}),
    ("unknown-key", {**_data(), "shell": "/bin/sh -c 'rm -rf /'"}),
    ("other-version", {**_data(), "version": 2}),
    ("no-pods", {**_data(), "pods": []}),
    ("same-pod-twice", {**_data(), "pods": [PODS[0], PODS[0]]}),
    ("pod-not-a-label", {**_data(), "pods": ["rankpack-s1-0; true"]}),
    ("pod-uppercase", {**_data(), "pods": ["Rankpack-s1-0"]}),
    ("namespace-not-a-label", {**_data(), "namespace": "../kube-system"}),
    ("sim-id-bad", {**_data(), "sim_id": "S 1"}),
    ("relative-path", {**_data(), "log_path": "log.simpleFoam"}),
    ("dotdot-path", {**_data(), "exit_path": "/runs/r1/../../etc/passwd"}),
    ("nul-in-path", {**_data(), "hostfile": "/runs/r1/\u0000x"}),
    ("empty-command", {**_data(), "command": []}),
    ("command-not-strings", {**_data(), "command": ["simpleFoam", 3]}),
    ("command-a-string", {**_data(), "command": "simpleFoam -parallel"}),
    ("env-bad-name", {**_data(), "env": {"A=B": "x"}}),
    ("env-not-string", {**_data(), "env": {"A": 1}}),
    ("timeout-negative", {**_data(), "start_timeout_s": -1}),
    ("timeout-bool", {**_data(), "start_timeout_s": True}),
    ("timeout-string", {**_data(), "start_timeout_s": "300"}),
    ("timeout-huge", {**_data(), "start_timeout_s": 1e12}),
    ("subnet-bad", {**_data(), "subnet": "10.201.0.0/33"}),
    ("subnet-not-string", {**_data(), "subnet": 10}),
    ("mpi-unknown", {**_data(), "mpi": "intelmpi"}),
    ("mpi-not-string", {**_data(), "mpi": ["mpich"]}),
    ("transport-unknown", {**_data(), "transport": "shm"}),
    ("fewer-ranks-than-pods", {**_data(), "ranks": 2}),
    ("ranks-bool", {**_data(), "ranks": True}),
    ("ranks-string", {**_data(), "ranks": "4"}),
    ("ranks-too-many", {**_data(), "ranks": 1 << 20}),
]


@pytest.mark.parametrize(("name", "data"), BAD, ids=[b[0] for b in BAD])
def test_bad_instructions_are_refused(name: str, data: Any) -> None:
    text = data if isinstance(data, str) else json.dumps(data)
    with pytest.raises(InstructionsError):
        Instructions.parse(text)


def test_mpich_instructions_round_trip_and_older_ones_mean_open_mpi_over_tcp() -> None:
    ins = instructions(Path("/runs/r1"), mpi="mpich", transport="tcp", ranks=3)
    assert Instructions.parse(ins.to_json()) == ins
    assert instructions(Path("/runs/r1")).transport == "auto"  # (the default now)
    older = {k: v for k, v in _data().items() if k not in ("mpi", "transport", "ranks")}
    parsed = Instructions.parse(json.dumps(older))
    # written before MPICH, shared memory and rank groups: Open MPI over TCP, a rank per pod
    assert (parsed.mpi, parsed.transport, parsed.n_ranks) == ("openmpi", "tcp", len(PODS))


def test_a_subnet_is_normalised() -> None:
    data = {**_data(), "subnet": "10.201.0.7/24"}
    assert Instructions.parse(json.dumps(data)).subnet == "10.201.0.0/24"


# -- the pure parts --------------------------------------------------------------------------


def _pod_at(name: str, ip: str | None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"podIP": ip}}


@pytest.mark.parametrize(
    ("given", "own_ip", "subnet"),
    [
        ("10.9.0.0/16", "10.201.0.20", "10.9.0.0/16"),
        (None, "10.201.0.20", "10.201.0.0/24"),
        (None, "10.201.7.20", None),  # mpirun's address outside the ranks' /24
        (None, None, None),  # its own address unknown: Open MPI picks
    ],
    ids=["given-wins", "same-24", "launcher-elsewhere", "own-ip-unknown"],
)
def test_choose_subnet(given: str | None, own_ip: str | None, subnet: str | None) -> None:
    pods = [_pod_at(p, f"10.201.0.{10 + i}") for i, p in enumerate(PODS)]
    ins = instructions(Path("/runs/r1"), subnet=given)
    assert launcher.choose_subnet(ins, pods, own_ip) == subnet


def test_mpirun_env_names_the_key_and_the_hosts_and_no_preload(tmp_path: Path) -> None:
    env = launcher.mpirun_env(instructions(Path("/runs/r1")), tmp_path / "hosts.json")
    # (SHELL: Open MPI reads the user's login shell, which an image's numeric user may lack)
    assert env == {"RANKPACK_RANKD_KEY": "/etc/rankpack/sim/key",
                   "RANKPACK_RANKD_HOSTS": str(tmp_path / "hosts.json"),
                   "SHELL": "/bin/sh"}  # fmt: skip


# -- waiting for the rank pods (fake API, virtual time) ----------------------------------------


def _rank_pods() -> FakeKubeApi:
    api = FakeKubeApi()
    for name in PODS:
        labels = {"app.kubernetes.io/managed-by": "rankpack", "rankpack.dev/sim": SIM}
        api.create("pods", {"metadata": {"name": name, "labels": labels},
                            "spec": {"containers": [{"name": "rank",
                                     "resources": {"requests": {"cpu": "250m"}}}]}})  # fmt: skip
    return api


def _run_all(api: FakeKubeApi) -> None:
    for i, name in enumerate(PODS):
        api.run_pod(name, ip=f"10.201.0.{10 + i}")


def test_wait_returns_the_pods_in_rank_order_once_all_run(tmp_path: Path) -> None:
    api, clock = _rank_pods(), FakeClock()
    api.run_pod(PODS[0])

    def sleep(s: float) -> None:
        clock.sleep(s)
        if clock.t >= 3:
            _run_all(api)

    pods = launcher.wait_for_ranks(api, instructions(tmp_path), clock=clock, sleep=sleep)
    assert [p["metadata"]["name"] for p in pods] == list(PODS)
    # a list after 0.1 s, each pause 1.5x the last, up to poll_s (1 s)
    assert clock.sleeps == pytest.approx([0.1, 0.15, 0.225, 0.3375, 0.50625, 0.759375, 1.0])
    assert clock.t == pytest.approx(3.078125)


def test_wait_is_bounded_and_says_what_it_waited_for(tmp_path: Path) -> None:
    api, clock = _rank_pods(), FakeClock()
    api.run_pod(PODS[0])
    with pytest.raises(LaunchError, match="not running after 30 s") as err:
        launcher.wait_for_ranks(api, instructions(tmp_path), clock=clock, sleep=clock.sleep)
    assert f"{PODS[1]}: Pending" in str(err.value) and PODS[0] + ":" not in str(err.value)
    assert clock.t == 30.0


def test_a_failed_rank_pod_ends_the_wait_at_once(tmp_path: Path) -> None:
    api, clock = _rank_pods(), FakeClock()
    api.run_pod(PODS[0])
    api.evict(PODS[0])
    with pytest.raises(LaunchError, match="evicted"):
        launcher.wait_for_ranks(api, instructions(tmp_path), clock=clock, sleep=clock.sleep)
    assert clock.t == 0.0


def flaky(errors: list[ApiError]) -> FakeKubeApi:
    """An apiserver whose next pod lists raise ``errors``."""
    return FakeKubeApi(fail_next={"list_pods": errors})


def test_an_api_that_does_not_answer_is_asked_again(tmp_path: Path) -> None:
    api, clock = flaky([ApiError(0, "Unreachable"), ApiError(503, "Unavailable")]), FakeClock()
    api.objects = _rank_pods().objects
    _run_all(api)
    pods = launcher.wait_for_ranks(api, instructions(tmp_path), clock=clock, sleep=clock.sleep)
    assert len(pods) == 3 and clock.t == pytest.approx(0.25)


def test_a_refusal_says_which_rights_are_missing(tmp_path: Path) -> None:
    api, clock = flaky([ApiError(403, "Forbidden", "pods is forbidden")]), FakeClock()
    with pytest.raises(LaunchError, match="ServiceAccount needs pods get/list"):
        launcher.wait_for_ranks(api, instructions(tmp_path), clock=clock, sleep=clock.sleep)


# -- what the init container writes for rankpack-launch -------------------------------------------


class PrepHarness:
    def __init__(self, tmp_path: Path, **kw: Any) -> None:
        self.case = tmp_path / "run"
        (self.case / ".rankpack").mkdir(parents=True)
        self.out = tmp_path / "launch"
        self.out.mkdir()
        self.ins = instructions(self.case, **kw)
        self.api = _rank_pods()
        _run_all(self.api)
        self.clock = FakeClock()
        self.prep = Preparation(
            self.ins, self.api, clock=self.clock, sleep=self.clock.sleep,
            environ={"RANKPACK_POD_IP": "10.201.0.30", "LD_PRELOAD": "/x.so"},
        )  # fmt: skip

    def spec(self) -> dict[str, Any]:
        self.prep.run(self.out)
        data: dict[str, Any] = json.loads((self.out / "launch.json").read_text())
        return data


def test_the_launch_spec_runs_the_images_mpirun_with_the_case_volumes_agent(
    tmp_path: Path,
) -> None:
    h = PrepHarness(tmp_path)
    spec = h.spec()
    agent = h.case / ".rankpack" / "bin" / "rankpack-exec"
    text = " ".join(spec["args"])
    assert spec["version"] == 1 and spec["mpirun"] == ["mpirun.openmpi", "mpirun"]
    assert spec["cwd"] == str(h.case)
    assert (spec["log"], spec["exit"]) == (str(h.case / "log.simpleFoam"),
                                           str(h.case / ".rankpack" / "mpirun.exit"))  # fmt: skip
    assert f"--mca plm_rsh_agent {agent}" in text
    assert "--hostfile " + str(h.case / ".rankpack" / "hostfile") in text
    assert "--mca btl_tcp_if_include 10.201.0.0/24" in text
    assert "-x WM_PROJECT_DIR=/usr/share/openfoam" in text
    assert spec["args"][-2:] == ["simpleFoam", "-parallel"]
    assert "--allow-run-as-root" not in spec["args"]
    assert spec["env"]["RANKPACK_RANKD_HOSTS"] == str(h.out / "hosts.json")
    hosts = json.loads((h.out / "hosts.json").read_text())
    assert hosts == {p: f"10.201.0.{10 + i}" for i, p in enumerate(PODS)}
    # nothing ran: rankpack-launch takes the marker and starts mpirun
    assert exitwrapper.state(h.case / ".rankpack") == "never"
    # an Open MPI 5 in the image (its mpirun --version says so) gets PRRTE's options
    (prrte,) = spec["args_from_major"].values()
    assert list(spec["args_from_major"]) == ["5"]
    text5 = " ".join(prrte)
    assert f"--prtemca plm_ssh_agent {agent}" in text5 and "plm_rsh_agent" not in text5
    assert "--mca btl_tcp_if_include 10.201.0.0/24" in text5
    assert "oob_tcp_if_include" not in text5 and "vader" not in text5
    assert prrte[-2:] == ["simpleFoam", "-parallel"] and "--allow-run-as-root" not in prrte
    assert [a for a in prrte if a.startswith("WM_PROJECT_DIR=")] == [
        "WM_PROJECT_DIR=/usr/share/openfoam"
    ]


def test_an_mpich_spec_starts_hydra_calling_back_to_this_pod(tmp_path: Path) -> None:
    h = PrepHarness(tmp_path, mpi="mpich")
    spec = h.spec()
    text = " ".join(spec["args"])
    assert spec["mpirun"] == ["mpirun.mpich", "mpiexec.hydra", "mpiexec", "mpirun"]
    assert f"-launcher rsh -launcher-exec {h.case}/.rankpack/bin/rankpack-exec" in text
    assert "-localhost 10.201.0.30" in text  # this pod's IP: pod names do not resolve
    # the default transport: the library's own (shared memory within a pod) but UCX's cma
    assert "-genv UCX_TLS ^cma" in text and "MPIR_CVAR_NOLOCAL" not in text
    assert "-genv WM_PROJECT_DIR /usr/share/openfoam" in text
    assert "--mca" not in spec["args"] and "OMPI_ALLOW_RUN_AS_ROOT" not in spec["env"]
    assert "args_from_major" not in spec  # (hydra's options are the same in every MPICH)


def test_mpirun_starts_every_rank_of_the_group_pods(tmp_path: Path) -> None:
    spec = PrepHarness(tmp_path, ranks=5).spec()  # 3 group pods, 5 ranks
    assert spec["args"][spec["args"].index("-np") + 1] == "5"


def test_a_run_that_ended_already_is_not_waited_for(tmp_path: Path) -> None:
    h = PrepHarness(tmp_path)
    h.api = _rank_pods()  # (its rank pods are gone or never run again)
    h.prep.api = h.api
    exitwrapper.write_exit(h.case / ".rankpack" / "mpirun.exit", 0)
    spec = h.spec()  # rankpack-launch reads the exit file and says how it ended
    assert spec["exit"] == str(h.case / ".rankpack" / "mpirun.exit") and h.clock.t == 0


def test_a_signal_while_waiting_ends_it_writing_nothing(tmp_path: Path) -> None:
    h = PrepHarness(tmp_path)
    h.prep.on_signal(signal.SIGTERM)
    with pytest.raises(Stopped) as err:
        h.prep.run(h.out)
    assert err.value.signum == signal.SIGTERM and not (h.out / "launch.json").exists()


def test_main_refuses_bad_instructions_in_its_termination_message(tmp_path: Path) -> None:
    path, log = tmp_path / "launch.json", tmp_path / "termination-log"
    path.write_text('{"version": 1}')
    assert launcher.main([str(path), str(tmp_path)], termination_log=str(log)) == 2
    assert log.read_text().startswith(f"cannot read the instructions {path}: missing keys")
    # and beside where launch.json would be, for rankpack-launch waiting there
    assert (tmp_path / "failed").read_text() == log.read_text()


def test_main_without_a_service_account_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path, log = tmp_path / "launch.json", tmp_path / "termination-log"
    path.write_text(instructions(tmp_path).to_json())
    assert launcher.main([str(path), str(tmp_path)], termination_log=str(log)) == 2
    assert "cannot reach the Kubernetes API from the launcher pod" in log.read_text()
