"""A lost node, as the Kubernetes backend sees it (issue 28, item 4).

Which simulations are hit (a rank pod or the launcher pod on a lost node), the code
``NodeLost``, a failed mpirun end held until its nodes' Leases say whether a node was lost
(never judged on a transient stall: alive once every node renewed after the end), and the
pods of the lost node deleted at once at release. Against FakeKubeApi: the nodes and their
Leases are in the backend's cache as on a cluster.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes import lostnodes
from rankpack.backend.kubernetes.nodes.nodehealth import NodeHealthRules, failed_end_verdict
from rankpack.backend.protocol import SimPhase
from rankpack.core.failures import FailureCode
from tests.unit.backend.kubernetes._helpers import node_object
from tests.unit.backend.kubernetes.starting.test_podmode import LAUNCHER, PodHarness
from tests.unit.backend.kubernetes.test_backend import PLACED, PLACED_PODS, SIM
from tests.unit.backend.kubernetes.test_backend import Harness as HostHarness

pytestmark = pytest.mark.timeout(20)

NOW = datetime(2026, 11, 26, 3, 0, 0, tzinfo=UTC).timestamp()


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat().replace("+00:00", "Z")


def lease(name: str, renewed_s: float) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "renewTime": stamp(renewed_s),
                     "leaseDurationSeconds": 40}}  # fmt: skip


# -- the verdict on a failed end (pure) ------------------------------------------------------


def test_a_failed_end_waits_until_every_node_renewed_its_lease_after_it() -> None:
    nodes = [node_object("a"), node_object("b")]
    ended = NOW - 3
    fresh, old = lease("a", NOW - 1), lease("b", NOW - 8)  # b renewed before the end
    v = failed_end_verdict({"a", "b"}, nodes, {"a": fresh, "b": old}, ended, NOW)
    assert v.state == "wait" and v.why.startswith("waiting for a Lease renewal of b ")
    # b renews (it was a slow node, or a transient stall): the failure is the job's own
    renewed = {"a": fresh, "b": lease("b", NOW)}
    assert failed_end_verdict({"a", "b"}, nodes, renewed, ended, NOW).state == "alive"
    # b never renews and the control plane says so: lost
    gone = [node_object("a"), node_object("b", "Unknown")]
    v = failed_end_verdict({"a", "b"}, gone, {"a": fresh, "b": old}, ended, NOW + 50)
    assert v.state == "lost" and "no longer hears" in v.why


def test_a_failed_end_is_not_held_for_ever_nor_without_leases() -> None:
    nodes = [node_object("a")]
    old = {"a": lease("a", NOW - 100)}  # (a lease not renewed since: older than the end)
    rules = NodeHealthRules(grace_s=600, hold_s=80)
    assert failed_end_verdict({"a"}, nodes, old, NOW - 79, NOW, rules).state == "wait"
    assert failed_end_verdict({"a"}, nodes, old, NOW - 81, NOW, rules).state == "alive"
    # the Leases cannot be read: judged by the Ready condition alone, nothing waits
    assert failed_end_verdict({"a"}, nodes, None, NOW, NOW).state == "alive"
    unknown = [node_object("a", "Unknown"), node_object("b")]
    assert failed_end_verdict({"a"}, unknown, None, NOW, NOW).state == "lost"
    # a node without a Lease is judged by its Ready condition alone
    assert failed_end_verdict({"a"}, nodes, {}, NOW, NOW).state == "alive"
    # a renewal within the margin after the end does not count (node clocks may differ)
    near = {"a": lease("a", NOW + 0.5)}
    assert failed_end_verdict({"a"}, nodes, near, NOW, NOW + 1).state == "wait"


def test_a_lease_stale_past_the_grace_is_lost_even_while_ready() -> None:
    old = {"a": lease("a", NOW - 61), "b": lease("b", NOW - 2)}
    v = failed_end_verdict({"a"}, [node_object("a"), node_object("b")], old, NOW - 30, NOW)
    assert v.state == "lost" and "61 s ago" in v.why


# -- which simulations are hit (the backend's records) ---------------------------------------


def _with_nodes(h: HostHarness, *names: str) -> None:
    h.api.nodes = [node_object(n) for n in names]
    h.api.leases = [lease(n, time.time()) for n in names]


def _busy(node: str, cpu: str) -> dict[str, Any]:
    """Another tenant's running pod on ``node`` asking for ``cpu``."""
    containers = [{"resources": {"requests": {"cpu": cpu}}}]
    return {"metadata": {"namespace": "elsewhere"},
            "spec": {"nodeName": node, "containers": containers},
            "status": {"phase": "Running"}}  # fmt: skip


def test_a_rank_pod_on_a_lost_node_fails_its_simulation_node_lost(tmp_path: Path) -> None:
    h = HostHarness(tmp_path)
    _with_nodes(h, "node-1", "node-2")
    # neither node has room for the 2000m of all three ranks: ranks 0 and 1 (500m) fill
    # node-1's 1500m first, rank 2 (1500m) goes to node-2's 1300m (`groups.plan_unplaced`)
    h.api.other_pods = [_busy("node-1", "2500m"), _busy("node-2", "2700m")]
    h.backend.launch(h.spec())
    h.run_all()  # each group pod on the node its affinity names
    assert [h.backend.sims[SIM].pods[r]["spec"]["nodeName"] for r in range(3)] == [
        "node-1", "node-1", "node-2"
    ]  # fmt: skip
    (proc,) = h.procs
    assert h.backend.observe(SIM).phase is SimPhase.RUNNING
    h.api.nodes[1] = node_object("node-2", "Unknown")  # the control plane no longer hears it
    h.api.leases[1] = lease("node-2", time.time() - 45)  # nor its Lease a renewal
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.NODE_LOST
    assert f"rank pod {PLACED_PODS[1]} is on a lost node" in obs.reason and "node-2" in obs.reason
    assert proc.signals  # mpirun was told to end
    (event,) = h.api.events
    assert (event["reason"], event["involvedObject"]["name"]) == (
        "SimulationFailed",
        PLACED_PODS[1],
    )
    h.api.actions.clear()
    h.backend.release(SIM)
    # the lost node's pod at once (no kubelet will confirm its end), the others gracefully
    forced = [a for a in h.api.actions if a[:2] == ("delete", "pods") and len(a) == 5]
    assert forced == [("delete", "pods", PLACED_PODS[1], "Background", 0)]


def test_simulations_wholly_on_other_nodes_go_on(tmp_path: Path) -> None:
    h = HostHarness(tmp_path)
    _with_nodes(h, "node-1", "node-2")
    h.backend.launch(h.spec())
    h.run_all()  # every rank on node-1
    h.api.nodes[1] = node_object("node-2", "Unknown")
    h.backend.poll_once()
    assert h.backend.observe(SIM).phase is SimPhase.RUNNING
    assert not h.api.events


def test_the_launcher_pod_on_a_lost_node_is_node_lost(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    _with_nodes(h, "node-1", "node-2")
    h.running()  # ranks on node-1 (run_pod's default), the launcher on node-1 too
    h.api.objects[("pods", LAUNCHER)]["spec"]["nodeName"] = "node-2"
    h.backend.poll_once()
    assert h.backend.observe(SIM).phase is SimPhase.RUNNING
    h.api.nodes[1] = node_object("node-2", "Unknown")
    h.api.leases[1] = lease("node-2", time.time() - 45)
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.failure is FailureCode.NODE_LOST and f"launcher pod {LAUNCHER}" in obs.reason
    sim = h.backend.sims[SIM]
    assert lostnodes.hit(sim, {"node-2": "x"}) == (-1, f"launcher pod {LAUNCHER} is on a lost "
                                                   "node: x")  # fmt: skip
    assert lostnodes.hit(sim, {"node-3": "x"}) is None


def test_mpirun_ending_first_is_held_then_node_lost(tmp_path: Path) -> None:
    """A crash breaks mpirun's connections to the node's ranks: mpirun ends with a failure
    within seconds, long before the node is judged lost. The end waits for the verdict."""
    h = PodHarness(tmp_path)
    _with_nodes(h, "node-1", "node-2")
    h.running(rank_nodes=PLACED)  # rank 2's group pod on node-2
    h.api.leases[1] = lease("node-2", time.time() - 40)  # its last renewal, before the crash
    h.end_launcher(1, reason="Error")
    h.api.leases[0] = lease("node-1", time.time() + 2)  # node-1 renews after the end
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.RUNNING, obs
    assert obs.reason.endswith("waiting for a Lease renewal of node-2 (a lost node ends it "
                               "NodeLost)")  # fmt: skip
    h.api.nodes[1] = node_object("node-2", "Unknown")
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.NODE_LOST
    assert "mpirun ended first" in obs.reason


def test_mpirun_failing_on_live_nodes_keeps_its_own_code(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    _with_nodes(h, "node-1")
    h.running()
    h.api.leases[0] = lease("node-1", time.time() - 5)
    h.end_launcher(1, reason="Error")
    h.backend.poll_once()
    assert h.backend.observe(SIM).phase is SimPhase.RUNNING  # held: not known yet
    h.api.leases[0] = lease("node-1", time.time() + 2)  # renewed after the end: alive
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.SOLVER_FAILED


def test_without_leases_a_failed_end_is_not_held(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    _with_nodes(h, "node-1")
    h.api.forbid_paths.add(lostnodes.LEASES.path)
    h.running()
    h.end_launcher(1, reason="Error")
    h.backend.poll_once()
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.FAILED and obs.failure is FailureCode.SOLVER_FAILED
