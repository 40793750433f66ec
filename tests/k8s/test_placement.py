"""Placement across nodes on a dev cluster of two 1-core nodes (issue 28, item 2).

`rankpack run --backend kubernetes --json` as a user runs it, with the backend's
ServiceAccount: a 2-rank simulation that fits one node gets both ranks on that node,
through a required node affinity (never ``nodeName``: the scheduler still checks the fit);
the issue's 4 ranks of weights 1,1,3,3 and budget 1.6 (which one 1-core node cannot hold)
span both nodes, a heavy and a light rank on each, so that both phases fit and every phase
resize completes in place; the run JSON names each rank's node.

The backend's ServiceAccount reads nodes (ClusterRole ``rankpack-backend-nodes``, deploy/):
without them the controller would have nothing to place on.

The module takes the session's one-node cluster down and brings up its own two nodes (as
`test_nodes.py` does); the next test that needs the session's cluster brings that back.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from tests.cli_runner import rankpack
from tests.k8s.conftest import DevCluster
from tests.k8s.operators import endless_pitzdaily

NODES = ("rankpack-node", "rankpack-node-1")
HOSTNAME = "kubernetes.io/hostname"


class PodWatch:
    """Every rank pod seen while a run goes on: its node, and the node its affinity asks
    for (read as the admin, once a second, beside the run)."""

    def __init__(self, two: DevCluster) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(two.admin_api())
        self.ns = two.namespace
        self.seen: dict[str, tuple[str | None, list[str], bool]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PodWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def _run(self) -> None:
        while not self.stop.is_set():
            for pod in self.core.list_namespaced_pod(
                self.ns, label_selector="rankpack.dev/group"
            ).items:
                self.seen[pod.metadata.name] = (
                    pod.spec.node_name,
                    affinity_nodes(pod),
                    pod.spec.node_selector is not None,
                )
            self.stop.wait(1.0)


def affinity_nodes(pod: Any) -> list[str]:
    """The nodes a pod's required node affinity allows (by hostname), [] if none."""
    aff = pod.spec.affinity
    if aff is None or aff.node_affinity is None:
        return []
    required = aff.node_affinity.required_during_scheduling_ignored_during_execution
    out: list[str] = []
    for term in required.node_selector_terms:
        for expr in term.match_expressions or []:
            assert (expr.key, expr.operator) == (HOSTNAME, "In")
            out += expr.values
    return out


def run(two: DevCluster, tmp: Path, *argv: str) -> tuple[dict[str, Any], float]:
    env = {**os.environ, "RANKPACK_DB": str(tmp / "rankpack.db"),
           "RANKPACK_HOME": str(tmp / "home")}  # fmt: skip
    t0 = time.monotonic()
    proc = rankpack("run", str(endless_pitzdaily(tmp)), "--backend", "kubernetes",
                    "--kubeconfig", str(two.up_result.service_account_kubeconfig), "--json",
                    *argv, timeout=150, env=env)  # fmt: skip
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    return json.loads(proc.stdout), took


def test_a_simulation_that_fits_one_node_runs_there_through_the_affinity(
    two: DevCluster, tmp_path: Path
) -> None:
    with PodWatch(two) as watch:
        data, took = run(two, tmp_path, "--ranks", "2", "--budget", "0.8",
                         "--iterations", "20")  # fmt: skip
    print(f"\n2 ranks: {data['status']} in {data['wall_s']:.1f} s ({took:.1f} s with the CLI)")
    assert data["status"] == "completed", data["message"]
    nodes = [r["node"] for r in data["ranks"]]
    assert nodes[0] in NODES and nodes == [nodes[0]] * 2  # one node: it fits there
    pods = {name: seen for name, seen in watch.seen.items() if "launcher" not in name}
    assert len(pods) == 1, watch.seen  # its two ranks share a pod (decision 0012)
    for node, asked, selector in pods.values():
        assert asked == [nodes[0]] and node == nodes[0] and not selector


def test_the_issues_run_spans_both_nodes_and_every_phase_resize_completes(
    two: DevCluster, tmp_path: Path
) -> None:
    with PodWatch(two) as watch:
        data, took = run(
            two, tmp_path, "--ranks", "4", "--weights", "1,1,3,3", "--budget", "1.6",
            "--iterations", "40", "--phases", "0:200,200,600,600;0.5:400,400,400,400",
        )  # fmt: skip
    print(
        f"\n4 ranks: {data['status']} in {data['wall_s']:.1f} s ({took:.1f} s with the CLI);"
        f" nodes {[r['node'] for r in data['ranks']]}; resizes "
        f"{[(r['rank'], r['to_millis'], r['status'], r['latency_s']) for r in data['resizes']]}"
    )
    assert data["status"] == "completed", data["message"]
    nodes = [r["node"] for r in data["ranks"]]
    assert sorted(nodes) == sorted(NODES * 2)  # spans both: 1.6 cores fit no 1-core node
    assert nodes[0] != nodes[1] and nodes[2] != nodes[3]  # a light and a heavy rank on each
    assert data["restarts"] == 0
    assert sorted((r["rank"], r["to_millis"], r["status"]) for r in data["resizes"]) == [
        (rank, 400, "completed") for rank in range(4)
    ]
    assert all(r["duty"] is not None for r in data["ranks"])
    for name, (node, asked, _) in watch.seen.items():
        if "launcher" not in name:
            assert asked == [node], (name, node, asked)
