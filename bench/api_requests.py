"""Apiserver requests of one simulation (2 ranks; `--ranks 4`) on the dev cluster (issue 29).

Reads the apiserver's own ``apiserver_request_total`` (summed by verb and resource) before
and after an idle minute, then before and after one ``rankpack run`` on the Kubernetes
backend (2 ranks or ``--ranks``, a phase schedule that resizes both in place, the backend's
ServiceAccount), on an otherwise idle dev cluster. The metric has no per-client label:
what the cluster's own components do (kubelet status updates, the scheduler's bindings,
the garbage collector, their Events) is in it too, so the idle rate is subtracted and the
verbs only rankpack uses are shown apart. When the tree measured has the client-side
counter (`run --json`'s ``api_requests``), it is shown beside.

The case is pitzDaily without its residualControl (it runs the iterations asked for: the
tutorial converges near 285, ~20 s here). Usage (root; the dev cluster up, nothing else on
it):
    python bench/api_requests.py [--src DIR] [--iterations N] [--idle-s S] [--json]
``--src`` is the source tree to run (its ``src``; default: this checkout's), so the same
measurement runs on main ("before") and on a branch ("after").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "src"))
_LINE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<n>[0-9.e+]+)$")
ONLY_RANKPACK = (
    "create configmaps", "create services", "create pods", "patch pods/resize",
    "delete configmaps", "list resourcequotas", "list limitranges", "list configmaps",
    "connect pods/exec", "create pods/exec", "get pods/exec",
)  # fmt: skip
"""What the cluster's components do not do while only rankpack's simulation runs."""


def status() -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "rankpack", "dev-cluster", "status", "--json"],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(HERE / "src")})  # fmt: skip
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def counts(admin_kubeconfig: str) -> Counter[str]:
    """``apiserver_request_total`` by "verb resource[/subresource]" (one scrape: a GET of
    no resource)."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=admin_kubeconfig)
    method, url, headers, _b, _p = api.param_serialize(
        method="GET", resource_path="/metrics", header_params={"Accept": "text/plain"},
        auth_settings=["BearerToken"],
    )  # fmt: skip
    text = api.call_api(method, url, header_params=headers).read().decode()
    out: Counter[str] = Counter()
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
        resource = labels.get("resource", "") or "-"
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        verb = labels.get("verb", "").lower()
        verb = {"post": "create", "put": "update"}.get(verb, verb)  # as the client names them
        out[f"{verb} {resource}"] += int(float(m["n"]))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", type=Path, default=HERE / "src", help="the rankpack sources to run")
    p.add_argument("--iterations", type=int, default=1200)
    p.add_argument("--ranks", type=int, default=2, help="rank pods of the run (2 or more)")
    p.add_argument("--idle-s", type=float, default=60.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from rankpack.case.openfoam import EXAMPLES_ROOT, KNOWN_TUTORIALS

    st = status()
    if not st.get("ready"):
        raise SystemExit("the dev cluster is not up (rankpack dev-cluster up)")
    admin, sa = st["kubeconfig"], st["service_account_kubeconfig"]

    t0, c0 = time.monotonic(), counts(admin)
    time.sleep(args.idle_s)
    t1, c1 = time.monotonic(), counts(admin)
    idle = c1 - c0
    idle_per_min = (sum(idle.values()) - 1) * 60.0 / (t1 - t0)  # (less one scrape)

    with tempfile.TemporaryDirectory(prefix="rankpack-api-") as work:
        env = {**os.environ, "PYTHONPATH": str(args.src), "RANKPACK_HOME": f"{work}/home",
               "RANKPACK_DB": f"{work}/bench.db"}  # fmt: skip
        case = Path(work) / "pitzDailyLong"  # without residualControl: runs --iterations
        shutil.copytree(EXAMPLES_ROOT / KNOWN_TUTORIALS["pitzDaily"], case)
        fv = case / "system" / "fvSolution"
        fv.write_text(re.sub(r"residualControl\s*\{[^}]*\}", "", fv.read_text()))
        n = args.ranks
        # 2 ranks: 300m/700m, swapped at 30 % (the measurement's first shape); more ranks:
        # 200m/500m alternating, swapped (room on the 2-core node for the launcher pod)
        first = [300, 700] if n == 2 else [200 if i % 2 == 0 else 500 for i in range(n)]
        second = [sum(first[:2]) - m for m in first]
        phases = f"0:{','.join(map(str, first))};0.3:{','.join(map(str, second))}"
        argv = [sys.executable, "-m", "rankpack", "run", str(case), "--backend", "kubernetes",
                "--kubeconfig", sa, "--allocatable", "2", "--ranks", str(n),
                "--weights", ",".join(["1"] * n), "--budget", str(sum(first) / 1000),
                "--iterations", str(args.iterations), "--wait", "polite",
                "--phases", phases, "--json"]  # fmt: skip
        t2, c2 = time.monotonic(), counts(admin)
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        t3, c3 = time.monotonic(), counts(admin)
    run = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    window_s = t3 - t2
    during = c3 - c2
    total = sum(during.values()) - 1
    above_idle = total - idle_per_min * window_s / 60.0
    client = run.get("api_requests")
    report = {
        "src": str(args.src),
        "status": run.get("status", f"error: {done.stderr.strip()[-300:]}"),
        "wall_s": run.get("wall_s"),
        "resizes": [
            (r["rank"], r["from_millis"], r["to_millis"], r["status"])
            for r in run.get("resizes", [])
        ],
        "idle_per_min": round(idle_per_min, 1),
        "window_s": round(window_s, 1),
        "apiserver_total": total,
        "apiserver_per_min": round(total * 60.0 / window_s, 1),
        "apiserver_above_idle_per_min": round(above_idle * 60.0 / window_s, 1),
        "apiserver_only_rankpack": {k: during[k] for k in ONLY_RANKPACK if during[k]},
        "apiserver_by": dict(sorted((k, n) for k, n in during.items() if n)),
        "client": client,
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['src']}: {report['status']} in {report['wall_s']} s; resizes "
          f"{report['resizes']}")  # fmt: skip
    print(f"idle cluster: {report['idle_per_min']} requests/min")
    print(f"during the run ({report['window_s']} s): {total} requests, "
          f"{report['apiserver_per_min']}/min, {report['apiserver_above_idle_per_min']}/min "
          "above idle")  # fmt: skip
    for k, n in sorted(during.items(), key=lambda kv: -kv[1]):
        if n:
            print(f"  {n:6d}  {k}")
    if client:
        print(f"rankpack's own counter: {client['total']} requests, {client['per_minute']}/min "
              f"over {client['elapsed_s']} s: {client['by']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
