"""The in-cluster operator's apiserver requests per running Simulation (issue 42).

Issue 42 writes more into each Simulation's status (ETA, duty, efficiency, nodes,
residuals) at the status cadence (10 s) and keeps the operator within 30 apiserver requests
a minute per running Simulation. This measures it on the dev cluster with the in-cluster
operator (`rankpack dev-cluster up --operator`): the leading operator's own client-side
count, ``rankpack_apiserver_requests_total`` (by verb, resource and code) on its
``/metrics``, read through the apiserver's pod proxy (the proxy's GETs are the script's,
not the operator's), over an idle window and then over a window where ``--sims`` endless
pitzDaily Simulations all run. Per running Simulation: (rate while they run - idle rate)
/ the number running (all ``--sims``, or as many as the launch gate runs at once); the
total rate / that number is shown too (it charges the fixed cost, the Lease
and the watches, to the Simulations).

Usage (root; the dev cluster up with the operator, nothing else running on it):
    python bench/operator_requests.py [--sims N] [--ranks R] [--idle-s S] [--window-s S] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "src"))
sys.path.insert(0, str(HERE))

from tests.k8s.operators import endless_pitzdaily  # noqa: E402

from rankpack.devcluster import deploy  # noqa: E402
from rankpack.devcluster.binaries import DEFAULT_VERSION, KubeVersion  # noqa: E402
from rankpack.devcluster.layout import NAMESPACE, Layout, default_state_dir  # noqa: E402
from rankpack.operator import crd, manifests  # noqa: E402

_LINE = re.compile(r"^(?P<name>rankpack_[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<n>[0-9.e+-]+)$")
PREFIX = "bench-requests-"


class Cluster:
    def __init__(self, state_dir: Path) -> None:
        self.layout = Layout(state_dir)
        self.version = KubeVersion.parse(DEFAULT_VERSION)

    def kubectl(self, *args: str, timeout_s: float = 60) -> str:
        return deploy.kubectl(self.layout, self.version, [*args], timeout_s)

    def leader(self) -> str:
        lease = json.loads(self.kubectl("get", "lease", manifests.NAME, "-n",
                                        manifests.SYSTEM_NAMESPACE, "-o", "json"))  # fmt: skip
        return str(lease["spec"]["holderIdentity"])

    def metrics(self, pod: str) -> tuple[Counter[str], float]:
        """The operator's request count by "verb resource code", and how many Simulations it
        says run."""
        text = self.kubectl("get", "--raw", f"/api/v1/namespaces/{manifests.SYSTEM_NAMESPACE}"
                            f"/pods/{pod}:{manifests.METRICS_PORT}/proxy/metrics")  # fmt: skip
        counts: Counter[str] = Counter()
        running = 0.0
        for line in text.splitlines():
            m = _LINE.match(line)
            if m is None:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"] or ""))
            if m["name"] == "rankpack_apiserver_requests_total":
                key = f"{labels.get('verb')} {labels.get('resource')} {labels.get('code')}"
                counts[key] += int(float(m["n"]))
            elif m["name"] == "rankpack_simulations_running":
                running += float(m["n"])
        return counts, running

    def phases(self) -> dict[str, str]:
        items = json.loads(self.kubectl("get", f"simulations.{crd.GROUP}", "-n", NAMESPACE,
                                        "-o", "json"))["items"]  # fmt: skip
        return {o["metadata"]["name"]: (o.get("status") or {}).get("phase", "")
                for o in items if o["metadata"]["name"].startswith(PREFIX)}  # fmt: skip


def window(c: Cluster, pod: str, seconds: float) -> dict[str, Any]:
    before, _ = c.metrics(pod)
    t0 = time.monotonic()
    time.sleep(seconds)
    after, running = c.metrics(pod)
    took = time.monotonic() - t0
    diff = after - before
    return {"seconds": round(took, 1), "requests": sum(diff.values()),
            "per_min": round(sum(diff.values()) * 60 / took, 2), "running_after": running,
            "by_kind": dict(sorted(diff.items()))}  # fmt: skip


def simulation(name: str, case: str, ranks: int) -> dict[str, Any]:
    return {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": {"name": name},
            "spec": {"case": {"path": case}, "ranks": ranks, "iterations": 200000}}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--idle-s", type=float, default=60)
    ap.add_argument("--window-s", type=float, default=180)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    c = Cluster(default_state_dir())
    done = deploy.deploy(c.layout, c.version, 300)
    cases = done.runs_dir / "namespaces" / NAMESPACE / "cases"
    cases.mkdir(parents=True, exist_ok=True)
    case = endless_pitzdaily(cases)
    for path in [cases, case, *case.rglob("*")]:
        os.chown(path, manifests.RUN_AS, manifests.RUN_AS)
    in_pod = str(Path(manifests.tenant_path(NAMESPACE)) / "cases" / case.name)
    leader = c.leader()
    idle = window(c, leader, args.idle_s)
    names = [f"{PREFIX}{i}" for i in range(args.sims)]
    manifest = Path("/tmp/bench-operator-requests.json")
    items = [simulation(n, in_pod, args.ranks) for n in names]
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    c.kubectl("create", "-n", NAMESPACE, "-f", str(manifest))
    try:
        # all of them running, or as many as the launch gate runs at once after 300 s
        deadline = time.monotonic() + 300
        while list(c.phases().values()).count("Running") < len(names):
            if time.monotonic() > deadline:
                break
            time.sleep(2)
        time.sleep(20)  # past the launch's own requests
        before = list(c.phases().values()).count("Running")
        busy = window(c, leader, args.window_s)
        running = list(c.phases().values()).count("Running")
        if not before or running != before:
            raise SystemExit(f"{before} running before the window, {running} after: run again")
        if c.leader() != leader:
            raise SystemExit("the leader changed during the window: run again")
    finally:
        for n in names:
            c.kubectl("delete", f"simulations.{crd.GROUP}", n, "-n", NAMESPACE,
                      "--ignore-not-found", "--wait=false")  # fmt: skip
    result = {
        "sims": args.sims, "ranks": args.ranks, "running_at_once": running, "idle": idle,
        "running": busy,
        "per_sim_above_idle_per_min": round((busy["per_min"] - idle["per_min"]) / running, 2),
        "per_sim_total_per_min": round(busy["per_min"] / running, 2),
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"idle: {idle['per_min']}/min; {running} running: {busy['per_min']}/min; per "
              f"running Simulation: {result['per_sim_above_idle_per_min']}/min above idle, "
              f"{result['per_sim_total_per_min']}/min in all")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
