"""A lost node under the in-cluster operator (issue 28, item 4), on a 2-node dev cluster.

`dev-cluster up --nodes 2 --operator`'s layout: the operator (a Deployment) and a node
agent per node. Three Simulations of pitzDaily (2 ranks, 1 200 iterations, so written every
100) are created; once one runs past its first write and before its middle, the node the
operator is not on is crashed (`stop-node`). Each Simulation with a pod there goes back to
``Queued`` with the reason ``NodeLost`` within the documented bound, and resumes from its
last written time (its new log starts right after it: nothing before it runs twice); the
node is started again and used again; all three end ``Succeeded`` exactly once, with every
iteration; the ones hit report the iterations lost. The module brings its own cluster up
and takes it down (the next test that needs the session's one-node cluster brings that
back).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.objects import builders
from rankpack.devcluster import deploy
from rankpack.devcluster.binaries import DEFAULT_VERSION, KubeVersion
from rankpack.devcluster.layout import NAMESPACE, Layout
from rankpack.devcluster.lifecycle import bringup, clusterstate, teardown
from rankpack.devcluster.lifecycle.nodes import start_node, stop_node
from rankpack.operator import crd, manifests
from tests.k8s.conftest import DevCluster
from tests.k8s.test_operator_in_cluster import InCluster, _endless_case

NAMES = ("lost-a", "lost-b", "lost-c")
ITERATIONS = 1200
WRITE_EVERY = 100
"""`openfoam.write_steps(1200, 100)`: pitzDaily's own interval (12 writes). A run lasts about
a minute here: with 300 iterations (15 s since launches stopped waiting for DNS), the run
had ended before the status (one patch per 10 s) showed it past its first write."""
BOUND_S = 90.0
"""The documented bound from a node's crash to ``NodeLost`` (docs/kubernetes.md)."""
AWAY_S = 90.0
"""How long the stopped node stays away (the issue's scenario)."""
TAKEOVER_S = 30.0
"""The bound from the leader's node stopping to the standby leading (issue 40)."""
ROLLBACK_S = 60.0
"""The bound on a pod ``Pending`` before its launch is rolled back (issue 40)."""
SIM_LABEL = "rankpack.dev/sim"

# ~6 min with its own up and down: not in `setup.sh test` (a fresh machine's run would come
# back to ~70 of its 75 minutes), run with `pytest -m k8s_slow tests/k8s`
pytestmark = [pytest.mark.timeout(1500), pytest.mark.k8s_slow]
"""Measured: 6 min with the module's own up and down (session 17; 10-15 min before launches
stopped waiting ~60 s for DNS in the launcher pod). The operator launches the three one
after another (`NoGain`)."""


@pytest.fixture(scope="module")
def two_nodes(dev_cluster: DevCluster) -> Iterator[InCluster]:
    state_dir = dev_cluster.state_dir
    if clusterstate.running_components(Layout(state_dir)):
        report = teardown.down(state_dir)
        assert not report.leftovers, report.leftovers
    t0 = time.monotonic()
    result = bringup.up(dataclasses.replace(dev_cluster.options(), nodes=2))
    dev_cluster.up_result = result
    layout, version = Layout(state_dir), KubeVersion.parse(DEFAULT_VERSION)
    try:
        done = deploy.deploy(layout, version, 300)
        print(f"\nup --nodes 2 --operator in {time.monotonic() - t0:.0f} s")
        yield InCluster(dev_cluster, layout, version, done)
    finally:
        report = teardown.down(state_dir)
        assert not report.leftovers, report.leftovers


def _fixed_simulation(name: str, case: str) -> dict[str, Any]:
    return {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": name},
        "spec": {
            "case": {"path": case},
            "ranks": 2,
            "budgetMillis": 300,
            "iterations": ITERATIONS,
            "sizing": "fixed",
        },
    }


def _events(ic: InCluster, name: str) -> list[str]:
    return [str(e["reason"]) for e in ic.simulation_events(name)]


def _nodes_of(ic: InCluster) -> dict[str, set[str]]:
    """sim id -> the nodes of its pods (rank and launcher pods)."""
    out: dict[str, set[str]] = {}
    for pod in ic.pods(SIM_LABEL):
        node = pod["spec"].get("nodeName")
        if node:
            out.setdefault(pod["metadata"]["labels"][SIM_LABEL], set()).add(node)
    return out


def _create(ic: InCluster) -> None:
    in_pod = _endless_case(ic)
    manifest = ic.deployed.runs_dir / "lost-node.json"
    items = [_fixed_simulation(n, in_pod) for n in NAMES]
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    ic.kubectl("create", "-n", NAMESPACE, "-f", str(manifest))


def _launchers(ic: InCluster) -> dict[str, str]:
    """sim id -> the node of its launcher pod."""
    pods = ic.pods(f"{builders.ROLE_LABEL}={builders.LAUNCHER_ROLE}")
    return {p["metadata"]["labels"][SIM_LABEL]: p["spec"]["nodeName"]
            for p in pods if p["spec"].get("nodeName")}  # fmt: skip


@dataclass
class Truth:
    """What the phases say against what the pods are, seen at every poll (issue 40): no
    Simulation ``Running`` while a pod of its launch is ``Pending``, no pod ``Pending``
    longer than the rollback bound."""

    pending_since: dict[str, float] = field(default_factory=dict)
    lies: list[str] = field(default_factory=list)

    def look(self, ic: InCluster) -> None:
        now = time.monotonic()
        statuses = {n: ic.status(n) for n in NAMES}
        phases = {str(st.get("simId")): (n, st.get("phase")) for n, st in statuses.items()}
        pending = set()
        for pod in ic.pods(SIM_LABEL):
            name = pod["metadata"]["name"]
            if pod["status"].get("phase") != "Pending" or pod["metadata"].get("deletionTimestamp"):
                continue
            pending.add(name)
            first = self.pending_since.setdefault(name, now)
            if now - first > ROLLBACK_S:
                self.lies.append(f"{name} Pending for {now - first:.0f} s")
            sim, phase = phases.get(pod["metadata"]["labels"][SIM_LABEL], ("?", None))
            if phase == "Running":
                self.lies.append(f"{sim} Running while {name} is Pending")
        for name in set(self.pending_since) - pending:
            del self.pending_since[name]


def _stop_and_check(ic: InCluster, victim: str, t_stop: float, hit: set[str],
                    before: dict[str, Any], truth: Truth) -> None:  # fmt: skip
    """After ``victim`` was stopped at ``t_stop``: every Simulation hit requeued
    ``NodeLost`` within the bound, the node back after 90 s, and all three ``Succeeded``
    exactly once, the ones hit resumed from their last write, none ``LaunchFailed``."""
    runs = ic.deployed.runs_dir
    lost_s: dict[str, float] = {}

    def all_lost() -> bool:
        truth.look(ic)
        for name in hit - set(lost_s):
            st = ic.status(name)
            if st.get("reason") == "NodeLost" or st.get("nodeLost"):
                lost_s[name] = time.monotonic() - t_stop
        return set(lost_s) == hit

    ic.wait("every Simulation hit to be requeued NodeLost", all_lost, BOUND_S + 30)
    print(f"NodeLost after {json.dumps({k: round(v, 1) for k, v in lost_s.items()})} s")
    assert max(lost_s.values()) <= BOUND_S, lost_s
    spared = {n for n, st in before.items() if st.get("phase") == "Running"} - hit
    for name in spared:  # wholly on the other node: untouched
        st = ic.status(name)
        assert st.get("simId") == before[name]["simId"] and not st.get("nodeLost"), st
    while time.monotonic() - t_stop < AWAY_S:  # the node stays away as long as the issue's
        truth.look(ic)
        time.sleep(2)
    back_s = start_node(ic.layout.root, victim)
    back_at = datetime.now(UTC).replace(microsecond=0)
    away = time.monotonic() - t_stop
    print(f"{victim} Ready again in {back_s:.1f} s, {away:.0f} s after it stopped")
    relaunched: dict[str, set[str]] = {}
    """A Simulation hit -> the nodes of its pods once launched again."""

    since_back: dict[str, set[str]] = {}
    """Any Simulation launched once the node was back -> the nodes of its pods."""

    def ended() -> bool:
        truth.look(ic)
        by_sim = _nodes_of(ic)
        for name in NAMES:
            st = ic.status(name)
            sim_id, started = st.get("simId"), st.get("startedAt")
            if sim_id in by_sim and started and datetime.fromisoformat(
                    str(started).replace("Z", "+00:00")) >= back_at:  # fmt: skip
                since_back.setdefault(name, set()).update(by_sim[str(sim_id)])
        for name in hit:
            st = ic.status(name)
            sim_id = st.get("simId")
            if sim_id and sim_id != before[name]["simId"] and sim_id in by_sim:
                relaunched.setdefault(name, set()).update(by_sim[sim_id])
        return all(ic.status(n).get("phase") in ("Succeeded", "Failed") for n in NAMES)

    ic.wait("the three Simulations to end", ended, 600)
    for name in NAMES:
        st = ic.status(name)
        print(f"{name}: {json.dumps(st)[:1200]}")
        reasons = _events(ic, name)
        assert st["phase"] == "Succeeded", st
        assert st["iterations"] == ITERATIONS, st
        assert reasons.count("Succeeded") == 1, reasons
        assert "LaunchFailed" not in reasons and "LauncherLost" not in reasons, reasons
        if name not in hit:
            assert not st.get("nodeLost") and reasons.count("Launched") == 1, reasons
            continue
        lost = st["nodeLost"]
        assert reasons.count("NodeLost") == 1 and reasons.count("Resumed") == 1, reasons
        assert reasons.count("Launched") == 2, reasons
        kept, at = int(lost["iterationsKept"]), int(lost["iterationsAtLoss"])
        assert kept > 0 and kept % WRITE_EVERY == 0, lost
        assert lost["resumedFrom"] == str(kept), lost
        assert lost["iterationsLost"] == at - kept and 0 <= at - kept < 2 * WRITE_EVERY, lost
        run_dir = runs / Path(st["runDir"]).relative_to(manifests.RUNS_PATH)
        # the lost run's log kept beside; the new one starts right after the write
        assert (run_dir / "log.simpleFoam.lost-1").is_file()
        first = re.search(r"^Time = (\S+)$", (run_dir / "log.simpleFoam").read_text(), re.M)
        assert first is not None and float(first.group(1)) == kept + 1, first
        print(f"{name}: lost at iteration {at}, resumed from {kept}, {at - kept} lost")
    print(f"the nodes of the relaunched: {relaunched}")
    # the node that came back is schedulable again (Ready, the control plane's unreachable
    # taint gone); whether a launch lands there is the placement's choice (the fullest node
    # that fits first), so it is shown, not asserted
    print(f"launched once {victim} was back, on: {since_back}")
    back = ic.get(f"nodes/{victim}")
    taints = [t["key"] for t in back["spec"].get("taints") or []]
    ready = [c["status"] for c in back["status"]["conditions"] if c["type"] == "Ready"]
    assert ready == ["True"] and "node.kubernetes.io/unreachable" not in taints, back
    assert truth.lies == [], truth.lies


def _past_first_write(st: dict[str, Any]) -> bool:
    return st.get("phase") == "Running" and WRITE_EVERY + 5 < int(st.get("iterations") or 0) < (
        ITERATIONS // 2
    )


def _cleanup(ic: InCluster, victim: str | None) -> None:
    if victim is not None:
        start_node(ic.layout.root, victim)
    ic.print_operator_log(60)
    for name in NAMES:
        ic.kubectl("delete", f"simulations.{crd.GROUP}", name, "-n", NAMESPACE,
                   "--ignore-not-found")  # fmt: skip
    try:  # (the next test's placement starts from empty nodes)
        ic.wait("the Simulations' pods to go", lambda: not ic.pods(SIM_LABEL), 180)
    except AssertionError:
        left = [(p["metadata"]["name"], p["status"].get("phase"), p["spec"].get("nodeName"),
                 p["metadata"].get("deletionTimestamp")) for p in ic.pods(SIM_LABEL)]  # fmt: skip
        print(f"pods left 180 s after their Simulations were deleted: {left}")


def test_a_lost_node_requeues_its_simulations_which_resume(two_nodes: InCluster) -> None:
    """The node stopped holds rank pods, not the leading operator."""
    ic = two_nodes
    leader = ic.leader()
    nodes = sorted(n["metadata"]["name"] for n in ic.get("nodes")["items"])
    (victim,) = [n for n in nodes if n != leader["spec"]["nodeName"]]  # never the leader's
    _create(ic)
    truth = Truth()
    stopped: str | None = None
    try:

        def hit_running() -> bool:
            truth.look(ic)
            by_sim = _nodes_of(ic)
            return any(_past_first_write(st := ic.status(name))
                       and victim in by_sim.get(str(st.get("simId")), ())
                       for name in NAMES)  # fmt: skip

        ic.wait(f"a Simulation past its first write with a pod on {victim}", hit_running, 420)
        before = {n: ic.status(n) for n in NAMES}
        by_sim = _nodes_of(ic)
        hit = {n for n, st in before.items() if victim in by_sim.get(str(st.get("simId")), ())}
        print(f"\nstopping {victim}: hit {sorted(hit)}")
        proc = stop_node(ic.layout.root, victim)
        t_stop, stopped = time.monotonic(), victim
        assert proc.killed_pids
        _stop_and_check(ic, victim, t_stop, hit, before, truth)
        stopped = None
        assert ic.leader()["metadata"]["name"] == leader["metadata"]["name"]  # it led throughout
    finally:
        _cleanup(ic, stopped)


def test_the_node_of_the_leader_and_a_launcher_stops(two_nodes: InCluster) -> None:
    """The node stopped holds the leading operator and a running launcher: the standby, on
    the other node (the Deployment's preferred anti-affinity), leads within 30 s, finds the
    node lost, and the Simulations hit resume from their last write; none fails."""
    ic = two_nodes
    placed = [(p["metadata"]["name"], p["spec"]["nodeName"]) for p in ic.operator_pods()]
    assert len(placed) == 2 and len({node for _, node in placed}) == 2, placed
    _create(ic)
    truth = Truth()
    stopped: str | None = None
    try:
        found: list[str] = []

        def launcher_running() -> bool:
            truth.look(ic)
            where = _launchers(ic)
            for name in NAMES:
                st = ic.status(name)
                node = where.get(str(st.get("simId")))
                if node and _past_first_write(st):
                    found[:] = [node]
                    return True
            return False

        ic.wait("a Simulation past its first write", launcher_running, 420)
        (victim,) = found
        leader = ic.leader()
        if leader["spec"]["nodeName"] != victim:
            # hand the Lease to the operator on the launcher's node: the leader, deleted,
            # gives it up on SIGTERM; its replacement goes to the other node (anti-affinity)
            ic.kubectl("delete", "pod", leader["metadata"]["name"], "-n",
                       manifests.SYSTEM_NAMESPACE, "--wait=false")  # fmt: skip
            ic.wait("the operator on the launcher's node to lead",
                    lambda: ic.leader()["spec"]["nodeName"] == victim, 60)  # fmt: skip
            leader = ic.leader()
        before = {n: ic.status(n) for n in NAMES}
        by_sim = _nodes_of(ic)
        hit = {n for n, st in before.items() if victim in by_sim.get(str(st.get("simId")), ())}
        assert hit, (before, by_sim)
        print(f"\nstopping {victim} (leader {leader['metadata']['name']}): hit {sorted(hit)}")
        proc = stop_node(ic.layout.root, victim)
        t_stop, stopped = time.monotonic(), victim
        assert proc.killed_pids
        took: list[float] = []

        def standby_leads() -> bool:
            truth.look(ic)
            now = ic.leader(30)
            if now["metadata"]["name"] != leader["metadata"]["name"]:
                took.append(time.monotonic() - t_stop)
                return True
            return False

        ic.wait("the standby to lead", standby_leads, TAKEOVER_S + 30)
        print(f"the standby led {took[0]:.1f} s after the node stopped")
        assert took[0] <= TAKEOVER_S, took
        _stop_and_check(ic, victim, t_stop, hit, before, truth)
        stopped = None
    finally:
        _cleanup(ic, stopped)
