"""`rankpack operator` as the k8s tests run it: its own process (the CLI, as a user starts it)
with the least-privilege ServiceAccount; Simulations read as the admin, as `kubectl get` would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rankpack.operator import crd
from tests.cli_runner import rankpack
from tests.k8s.conftest import DevCluster
from tests.k8s.waits import until


class Env:
    def __init__(self, k8s: DevCluster, tmp: Path) -> None:
        from kubernetes import client

        self.k8s = k8s
        self.kubeconfig = str(k8s.up_result.service_account_kubeconfig)
        self.custom: Any = client.CustomObjectsApi(k8s.admin_api())
        self.env = {**os.environ, "RANKPACK_DB": str(tmp / "operator.db"),
                    "RANKPACK_HOME": str(tmp / "home")}  # fmt: skip
        (tmp / "home").mkdir()
        self.tmp = tmp
        self.db = tmp / "operator.db"
        self.procs: list[subprocess.Popen[str]] = []

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return rankpack(*argv, "--kubeconfig", self.kubeconfig, timeout=120, env=self.env)

    def operator(self, *extra: str, log: Path) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "rankpack", "operator", "--kubeconfig", self.kubeconfig,
                "--allocatable", "2", "--max-concurrent", "2",
                "--case-root", str(self.tmp), *extra]  # fmt: skip
        p = subprocess.Popen(argv, env=self.env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                             text=True)  # fmt: skip
        self.procs.append(p)
        return p

    def simulations(self) -> list[dict[str, Any]]:
        items = self.custom.list_namespaced_custom_object(
            crd.GROUP, crd.VERSION, self.k8s.namespace, crd.PLURAL
        )["items"]
        return sorted(items, key=lambda o: o["metadata"]["name"])

    def phases(self) -> list[str]:
        return [(o.get("status") or {}).get("phase", "-") for o in self.simulations()]

    def wait(self, what: str, cond: Any, timeout: float) -> None:
        until(what, cond, timeout, poll_s=0.5, said=self.phases)

    def status(self, name: str) -> dict[str, Any]:
        obj = self.custom.get_namespaced_custom_object(
            crd.GROUP, crd.VERSION, self.k8s.namespace, crd.PLURAL, name
        )
        return dict(obj.get("status") or {})

    def rank_pods(self) -> list[Any]:
        from kubernetes import client

        core = client.CoreV1Api(self.k8s.admin_api())
        return list(
            core.list_namespaced_pod(self.k8s.namespace, label_selector="rankpack.dev/sim").items
        )

    def events(self, name: str) -> list[Any]:
        """The Events on Simulation ``name`` (what `kubectl describe simulation` shows)."""
        from kubernetes import client

        core = client.CoreV1Api(self.k8s.admin_api())
        selector = f"involvedObject.kind=Simulation,involvedObject.name={name}"
        return list(core.list_namespaced_event(self.k8s.namespace, field_selector=selector).items)

    def launchers(self) -> list[int]:
        """Detached launchers (mpirun's parents) this test's operators started."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            text = [a.decode(errors="replace") for a in argv]
            if "rankpack.backend.kubernetes.starting.exitwrapper" in text and any(
                str(self.tmp) in a for a in text
            ):
                found.append(int(entry.name))
        return found

    def cleanup(self) -> None:
        """What SIGKILLed operators leave: their launchers, the simulations' objects."""
        import signal

        from kubernetes import client

        for pid in self.launchers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        core = client.CoreV1Api(self.k8s.admin_api())
        ns = self.k8s.namespace
        for cm in core.list_namespaced_config_map(
            ns, label_selector="app.kubernetes.io/managed-by=rankpack,rankpack.dev/sim"
        ).items:
            with contextlib.suppress(Exception):
                core.delete_namespaced_config_map(
                    cm.metadata.name, ns, propagation_policy="Foreground"
                )
        deadline = time.monotonic() + 90
        while self.rank_pods() and time.monotonic() < deadline:
            time.sleep(1)

    def runs(self) -> list[tuple[int, str, str]]:
        with sqlite3.connect(self.db) as conn:
            rows = conn.execute("SELECT id, status, options_json FROM runs ORDER BY id").fetchall()
        return [(r[0], r[1], json.loads(r[2]).get("sim_id", "")) for r in rows]


def endless_pitzdaily(where: Path) -> Path:
    """pitzDaily without its residualControl: it runs to the iteration count asked for (the
    tutorial converges and stops near 285 iterations, ~15 s here: too short to act on)."""
    from rankpack.case.openfoam import EXAMPLES_ROOT, KNOWN_TUTORIALS

    case = where / "pitzDailyLong"
    if not case.exists():
        shutil.copytree(EXAMPLES_ROOT / KNOWN_TUTORIALS["pitzDaily"], case)
        fv = case / "system" / "fvSolution"
        fv.write_text(re.sub(r"residualControl\s*\{[^}]*\}", "", fv.read_text()))
    return case
