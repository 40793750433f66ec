#!/usr/bin/env python3
"""Are the dev cluster's own daemons starved by rank pods? (issue 28: Lease renewals must
be reliable to judge a lost node.)

  .venv/bin/python bench/devcluster_starvation.py [--seconds 60] [--pods-per-node 2]

Needs a running dev cluster (`rankpack dev-cluster up --nodes N`, root). Runs two wake-up
probes (a loop of 10 ms sleeps recording how late each wake-up is), one in the cluster's
daemons' cgroup (`rankpack-dev-cluster`, cpu.shares 10240, where etcd, the apiserver and
the kubelets run) and one in the root cpu cgroup (where the test process or an
out-of-cluster controller runs), first idle and then while every node's CPUs are kept
busy by spinning pods (``--pods-per-node`` each, requests splitting the node's
allocatable); it also follows each node's Lease (``renewTime``, renewed every 10 s by the
kubelet) and reports the longest gap between renewals. Prints one table; deletes its pods.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rankpack.devcluster.layout import (
    HOST_USR_IMAGE,
    SYSTEM_CGROUP,
    Layout,
    default_state_dir,
)
from rankpack.devcluster.lifecycle import clusterstate

PROBE = """
import json, sys, time
end = time.monotonic() + float(sys.argv[1])
late = []
while time.monotonic() < end:
    t = time.monotonic()
    time.sleep(0.01)
    late.append(time.monotonic() - t - 0.01)
print(json.dumps(late))
"""
NAMESPACE = "default"
LABEL = "app.kubernetes.io/managed-by=rankpack-starvation-bench"


def spinner(name: str, node: str, millis: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by":
                                              "rankpack-starvation-bench"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            "containers": [{
                "name": "spin",
                "image": HOST_USR_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/usr/bin/python3", "-c", "while True: pass"],
                "resources": {"requests": {"cpu": f"{millis}m", "memory": "16Mi"}},
                "volumeMounts": [{"name": "usr", "mountPath": "/usr", "readOnly": True}],
            }],
            "volumes": [{"name": "usr", "hostPath": {"path": "/usr"}}],
        },
    }  # fmt: skip


def probe(seconds: float, cgroup: str | None) -> list[float]:
    """A probe process, joined to `cgroup` in the cpu and cpuacct hierarchies if given."""

    def join() -> None:
        if cgroup:
            for h in ("cpu", "cpuacct"):
                Path(f"/sys/fs/cgroup/{h}/{cgroup}/cgroup.procs").write_text("0")

    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(seconds)],
        capture_output=True, text=True, check=True, preexec_fn=join,
    ).stdout  # fmt: skip
    return list(json.loads(out))


def leases(core: Any, nodes: list[str], seconds: float) -> dict[str, float]:
    """The longest gap (s) between two renewals of each node's Lease while `seconds` pass."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    coord = client.CoordinationV1Api(core.api_client)
    last: dict[str, Any] = {}
    seen: dict[str, float] = {}
    gaps = dict.fromkeys(nodes, 0.0)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = time.monotonic()
        for n in nodes:
            try:
                renew = coord.read_namespaced_lease(n, "kube-node-lease").spec.renew_time
            except ApiException:  # not created yet (just after `up`)
                continue
            if renew != last.get(n):
                if n in seen:
                    gaps[n] = max(gaps[n], now - seen[n])
                last[n], seen[n] = renew, now
        time.sleep(0.5)
    return {n: round(g, 1) for n, g in gaps.items()}


def summary(late: list[float]) -> str:
    q = statistics.quantiles(late, n=100)
    return f"p50 {q[49] * 1000:6.1f} ms  p99 {q[98] * 1000:7.1f} ms  max {max(late):6.2f} s"


def measure(core: Any, nodes: list[str], seconds: float, label: str) -> None:
    results: dict[str, list[float]] = {}
    gaps: dict[str, float] = {}

    def run(name: str, cgroup: str | None) -> None:
        results[name] = probe(seconds, cgroup)

    threads = [
        threading.Thread(target=run, args=(f"{SYSTEM_CGROUP} (10240)", SYSTEM_CGROUP)),
        threading.Thread(target=run, args=("root cgroup (1024)", None)),
    ]
    for t in threads:
        t.start()
    gaps = leases(core, nodes, seconds)
    for t in threads:
        t.join()
    print(f"-- {label}")
    for name, late in results.items():
        print(f"  probe in {name:30s} {summary(late)}")
    print(f"  longest gap between Lease renewals (renewed every 10 s): {gaps}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--pods-per-node", type=int, default=2)
    args = ap.parse_args()
    from kubernetes import client, config

    layout = Layout(default_state_dir())
    status = clusterstate.status(layout.root)
    if not status["ready"]:
        print("no Ready dev cluster (rankpack dev-cluster up --nodes N)", file=sys.stderr)
        return 2
    core = client.CoreV1Api(config.new_client_from_config(str(layout.admin_kubeconfig)))
    nodes = [n["name"] for n in status["nodes"]]
    print(f"dev cluster of {len(nodes)} node(s): "
          + ", ".join(f"{n['name']} CPUs {n.get('cpus')}" for n in status["nodes"]))  # fmt: skip
    measure(core, nodes, args.seconds, "idle")
    try:
        for n in status["nodes"]:
            each = n["allocatable_millis"] // args.pods_per_node
            for i in range(args.pods_per_node):
                core.create_namespaced_pod(NAMESPACE, spinner(f"spin-{n['name']}-{i}",
                                                              n["name"], each))  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(NAMESPACE, label_selector=LABEL).items
            if all(p.status.phase == "Running" for p in pods):
                break
            time.sleep(1)
        time.sleep(3)
        busy = f"{args.pods_per_node} spinning pods per node (every CPU of every node busy)"
        measure(core, nodes, args.seconds, busy)
    finally:
        core.delete_collection_namespaced_pod(NAMESPACE, label_selector=LABEL,
                                              grace_period_seconds=0)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
