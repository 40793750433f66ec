"""MPI across nodes on a dev cluster of two 1-core nodes, Open MPI and MPICH (issue 28 item 3).

The Kubernetes backend as `rankpack run --backend kubernetes` drives it (mpirun on this host,
ranks entered through ``pods/exec`` with the backend's ServiceAccount), launching the same
2-rank MPI program (the shim's ``imbalance``, built for each MPI: Debian's OpenFOAM links
Open MPI only, so no MPICH solver exists on this machine) with the PMPI shim:

- each flavour with ranks of 800m, which one 1-core node cannot hold both of: the ranks
  land in a pod on each node, talk over TCP through the pod network only, complete, and
  every rank's shim record is read on its own node (a duty cycle each);
- each flavour with the default transport (``auto``), two ranks on one node: in one group
  pod they share memory (what the MPI says it chose: vader, UCX's sysv/posix memory); in
  two pods on that node, as two simulations' ranks are, they talk TCP (decision 0012).

The wall time of each run (launch to end, mpirun's start-up included) is printed for
docs/kubernetes-backend.md. The module takes the session's one-node cluster down and brings
up its own two nodes (as `test_nodes.py`); the next test that needs the session's cluster
brings it back.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from rankpack.backend.kubernetes import launch
from rankpack.backend.kubernetes.api.config import load_config
from rankpack.backend.kubernetes.backend import KubernetesBackend
from rankpack.backend.kubernetes.connect import connect
from rankpack.backend.kubernetes.objects.groups import RankGroup
from rankpack.backend.protocol import RankResources, ShimSpec, SimObservation, SimPhase, SimSpec
from rankpack.devcluster.nodefiles import with_node_files
from tests.k8s.conftest import DevCluster

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim"
NODES = ("rankpack-node", "rankpack-node-1")
HOSTNAME = "kubernetes.io/hostname"
ITERATIONS = 1500
COMPUTE_US = 2000
"""Rank 1 computes 2 ms an iteration, rank 0 twice that (``-k 2``): ~6 s of work, long
enough for the shim's records to be read on each node while it runs."""


@pytest.fixture(scope="module")
def programs() -> Path:
    """``shim/build/<flavour>/imbalance`` for both MPIs (and the shim libraries)."""
    subprocess.run(["make", "-s", "-C", str(SHIM), "programs", "install"], check=True,
                   timeout=120)  # fmt: skip
    return SHIM / "build"


def backend_for(two: DevCluster, transport: str) -> KubernetesBackend:
    config = load_config(two.up_result.service_account_kubeconfig, namespace=two.namespace)
    config = dataclasses.replace(
        with_node_files(config, two.up_result.state_dir),
        allocatable_millis=2000,
        mpi_transport=transport,  # type: ignore[arg-type]
    )
    return connect(config)


def run_program(
    backend: KubernetesBackend,
    tmp: Path,
    programs: Path,
    flavour: str,
    *,
    sim_id: str,
    request_millis: int,
    placement: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[SimObservation, dict[int, SimObservation], float, str]:
    """Launch the imbalance program on 2 rank pods, follow it to its end; the last
    observation, the latest observation per rank that had shim data, the wall time (launch to
    end) and the log."""
    case = tmp / sim_id
    case.mkdir()
    program = case / "imbalance"
    shutil.copy2(programs / flavour / "imbalance", program)
    spec = SimSpec(
        sim_id=sim_id,
        case_dir=case,
        command=(str(program), "-k", "2", "-n", str(ITERATIONS), "-c", str(COMPUTE_US)),
        ranks=(RankResources(request_millis), RankResources(request_millis)),
        log_path=case / "log",
        mpi=flavour,
        shim=ShimSpec("polite", flavour),
        placement=placement or {},
        env=env or {},
    )
    with_shim: dict[int, SimObservation] = {}
    t0 = time.monotonic()
    backend.launch(spec)
    try:
        deadline = t0 + 150
        while True:
            obs = backend.observe(sim_id)
            for r in obs.ranks:
                if r.compute_ns is not None and r.compute_ns > 0:
                    with_shim[r.rank] = obs
            if obs.phase in (SimPhase.SUCCEEDED, SimPhase.FAILED):
                break
            assert time.monotonic() < deadline, (obs.phase, obs.reason, stuck(spec.log_path))
            backend.wait(0.5)
        wall = time.monotonic() - t0
    finally:
        backend.release(sim_id)
    return obs, with_shim, wall, spec.log_path.read_text(errors="replace")


def stuck(log: Path) -> str:
    """What is left of a run that did not end, printed (pytest shows a failed test's output
    whole; an assertion message is cut): its MPI processes on this machine (the rank pods'
    included) with a backtrace of each rank (gdb), and where each rsh agent waits (they dump
    their stacks into the log on SIGUSR1)."""
    pattern = "imbalance|hydra|mpiexec|mpirun|orted|kubernetes.starting.rsh"
    ps = subprocess.run(["ps", "-eo", "pid,ppid,stat,wchan:32,etimes,args"], text=True,
                        capture_output=True, check=False).stdout  # fmt: skip
    rows = [row for row in ps.splitlines()[1:] if re.search(pattern, row)]
    out = list(rows)
    for row in rows:
        pid, args = row.split()[0], row.split(None, 5)[-1]
        if "imbalance" in args and "hydra" not in args and shutil.which("gdb"):
            gdb = ["gdb", "-p", pid, "-batch", "-ex", "thread apply all bt"]
            bt = subprocess.run(gdb, text=True, capture_output=True, timeout=60, check=False)
            out += [f"--- gdb -p {pid}", bt.stdout[-6000:]]
    subprocess.run(
        ["pkill", "-USR1", "-f", "rankpack.backend.kubernetes.starting.rsh"], check=False
    )
    time.sleep(2)
    out += ["--- log:", log.read_text(errors="replace")[-6000:]]
    text = "\n".join(out)
    print(text)
    return text[:300]


@pytest.mark.parametrize("flavour", ["mpich", "openmpi"])
def test_two_ranks_on_two_nodes_talk_over_tcp_and_complete(
    two: DevCluster, tmp_path: Path, programs: Path, flavour: str
) -> None:
    backend = backend_for(two, "tcp")
    try:
        obs, with_shim, wall, log = run_program(
            backend, tmp_path, programs, flavour, sim_id=f"x{flavour}", request_millis=800
        )
    finally:
        backend.close()
    nodes = [r.node for r in obs.ranks]
    duty = {
        rank: (o.ranks[rank].compute_ns, o.ranks[rank].mpi_ns, o.ranks[rank].node)
        for rank, o in sorted(with_shim.items())
    }
    print(f"\n{flavour} across nodes {nodes}: {obs.phase.value} exit {obs.exit_code} in "
          f"{wall:.1f} s; shim (compute_ns, mpi_ns, node) {duty}")  # fmt: skip
    assert obs.phase is SimPhase.SUCCEEDED, (obs.reason, log[-3000:])
    assert sorted(n or "" for n in nodes) == sorted(NODES)  # one rank on each node
    assert sorted(with_shim) == [0, 1], f"a shim record of every rank, read on its node: {duty}"
    for rank, o in with_shim.items():
        assert o.ranks[rank].node == nodes[rank]
        assert (o.ranks[rank].mpi_ns or 0) > 0
    # the program's own account: both ranks finished every iteration over the pod network
    assert "rank 0 compute_s" in log and "rank 1 compute_s" in log, log[-2000:]
    assert [r.restarts for r in obs.ranks] == [0, 0]
    assert wall < 120


VERBOSE = {
    "openmpi": {"OMPI_MCA_btl_base_verbose": "100"},
    "mpich": {"UCX_PROTO_ENABLE": "y", "UCX_PROTO_INFO": "y"},
}
"""What makes each MPI say which transport it chose for each peer: Open MPI's
``mca: bml: Using <btl> btl for send to [[job,1],<rank>]`` lines; UCX's protocol tables
(``tagged message by ucp_tag_send*() ... | <transport>/<device>``)."""


def transports(flavour: str, log: str) -> set[str]:
    """The transports the MPI says its ranks chose to reach each other (not themselves)."""
    if flavour == "openmpi":
        return {m.group(1) for m in re.finditer(r"Using (\w+) btl for send", log)} - {"self"}
    return {m.group(1) for m in re.finditer(r"\| (\w+)/\S+\s+\|", log)} - {"self"}


@pytest.mark.parametrize("flavour", ["mpich", "openmpi"])
def test_ranks_of_one_simulation_on_one_node_share_memory_ranks_of_two_pods_do_not(
    two: DevCluster, tmp_path: Path, programs: Path, flavour: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Decision 0012, through each MPI's own transport selection (the default transport,
    ``auto``): two ranks of one simulation on one node share their group pod and talk
    through shared memory (Open MPI's vader; UCX's sysv/posix memory); two ranks in two pods
    on one node, as two simulations' ranks always are, find no shared memory between them
    and talk TCP: a pod's ``/dev/shm`` and IPC namespace are its own."""
    backend = backend_for(two, "auto")
    try:
        obs, _, wall, log = run_program(
            backend, tmp_path, programs, flavour, sim_id=f"shm{flavour[0]}", request_millis=300,
            placement={HOSTNAME: NODES[0]}, env=VERBOSE[flavour],
        )  # fmt: skip
        pods = {r.pod for r in obs.ranks}
        assert obs.phase is SimPhase.SUCCEEDED, (obs.reason, log[-3000:])
        within = transports(flavour, log)
        print(f"\n{flavour}, one pod {pods} on {NODES[0]}: {sorted(within)} in {wall:.1f} s")
        assert len(pods) == 1 and {r.node for r in obs.ranks} == {NODES[0]}
        assert within and within <= {"vader", "sysv", "posix"}, log[-3000:]

        apart = (RankGroup(0, NODES[0], (0,)), RankGroup(1, NODES[0], (1,)))
        monkeypatch.setattr(launch, "plan", lambda spec, capacity: apart)
        obs, _, wall, log = run_program(
            backend, tmp_path, programs, flavour, sim_id=f"tcp{flavour[0]}", request_millis=300,
            placement={HOSTNAME: NODES[0]}, env=VERBOSE[flavour],
        )  # fmt: skip
    finally:
        backend.close()
    between = transports(flavour, log)
    pods = {r.pod for r in obs.ranks}
    print(f"{flavour}, two pods {sorted(p or '' for p in pods)} on {NODES[0]}: "
          f"{sorted(between)} in {wall:.1f} s")  # fmt: skip
    assert obs.phase is SimPhase.SUCCEEDED, (obs.reason, log[-3000:])
    assert len(pods) == 2 and {r.node for r in obs.ranks} == {NODES[0]}
    assert between == {"tcp"}, log[-3000:]
