"""`rankpack operator` on the dev cluster: Simulations multiplexed to completion, an operator
SIGKILLed mid-run and restarted (every simulation runs exactly once), two operators at once.

The operator runs as its own process (the CLI, as a user starts it) with the least-privilege
ServiceAccount; the test reads the Simulations as the admin, as `kubectl get` would.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rankpack.operator import crd
from tests.k8s.conftest import DevCluster


class Env:
    def __init__(self, k8s: DevCluster, tmp: Path) -> None:
        from kubernetes import client

        self.k8s = k8s
        self.kubeconfig = str(k8s.up_result.service_account_kubeconfig)
        self.custom: Any = client.CustomObjectsApi(k8s.admin_api())
        self.env = {**os.environ, "RANKPACK_DB": str(tmp / "operator.db"),
                    "RANKPACK_HOME": str(tmp / "home")}  # fmt: skip
        (tmp / "home").mkdir()
        self.db = tmp / "operator.db"
        self.procs: list[subprocess.Popen[str]] = []

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rankpack", *argv, "--kubeconfig", self.kubeconfig],
            capture_output=True, text=True, timeout=120, env=self.env, check=False,
        )  # fmt: skip

    def operator(self, *extra: str, log: Path) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "rankpack", "operator", "--kubeconfig", self.kubeconfig,
                "--allocatable", "2", "--max-concurrent", "2", *extra]  # fmt: skip
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}: {self.phases()}")

    def runs(self) -> list[tuple[int, str, str]]:
        with sqlite3.connect(self.db) as conn:
            rows = conn.execute("SELECT id, status, options_json FROM runs ORDER BY id").fetchall()
        return [(r[0], r[1], json.loads(r[2]).get("sim_id", "")) for r in rows]


@pytest.fixture
def env(k8s: DevCluster, tmp_path: Path) -> Iterator[Env]:
    e = Env(k8s, tmp_path)
    for o in e.simulations():  # a clean namespace: no Simulation of an earlier test
        e.custom.delete_namespaced_custom_object(
            crd.GROUP, crd.VERSION, k8s.namespace, crd.PLURAL, o["metadata"]["name"]
        )
    yield e
    for p in e.procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for o in e.simulations():
        e.custom.delete_namespaced_custom_object(
            crd.GROUP, crd.VERSION, k8s.namespace, crd.PLURAL, o["metadata"]["name"]
        )


def test_three_simulations_multiplexed_to_completion(env: Env, tmp_path: Path) -> None:
    made = env.cli("submit", "pitzDaily", "--backend", "kubernetes", "--ranks", "2",
                   "--iterations", "200", "--count", "3", "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    names = json.loads(made.stdout)["simulations"]
    assert len(names) == 3
    op = env.operator("--until-idle", "--json", log=tmp_path / "op.log")
    assert op.wait(timeout=600) == 0, (tmp_path / "op.log").read_text()[-3000:]
    sims = env.simulations()
    assert sorted(o["metadata"]["name"] for o in sims) == sorted(names)
    for o in sims:
        st = o["status"]
        assert st["phase"] == "Succeeded", st
        assert st["restarts"] == 0 and st["iterations"] == 200
        # sized in place to the measured duty cycles - or started at the sizes learned
        # from a copy profiled before (controller/learned.py): counted below
        assert st["result"]["status"] == "completed"
    assert sum(o["status"]["resizes"] for o in sims) >= 1, [o["status"] for o in sims]
    runs = env.runs()
    assert [r[1] for r in runs] == ["completed"] * 3
    listed = env.cli("simulations", "--json")
    assert [s["status"]["phase"] for s in json.loads(listed.stdout)] == ["Succeeded"] * 3


def test_sigkilled_operator_is_restarted_and_adopts_its_simulations(
    env: Env, tmp_path: Path
) -> None:
    made = env.cli("submit", "pitzDaily", "--backend", "kubernetes", "--ranks", "2",
                   "--iterations", "1500", "--count", "2", "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr

    def progressing() -> bool:
        sims = env.simulations()
        return any(int((o.get("status") or {}).get("iterations") or 0) >= 20 for o in sims)

    first = env.operator(log=tmp_path / "first.log")
    env.wait("a simulation making progress", progressing, 300)
    first.send_signal(signal.SIGKILL)
    first.wait()
    running = [o for o in env.simulations() if o["status"].get("phase") == "Running"]
    assert running, env.phases()
    launched = {o["metadata"]["name"]: o["status"].get("simId") for o in running}
    second = env.operator("--until-idle", log=tmp_path / "second.log")
    assert second.wait(timeout=900) == 0, (tmp_path / "second.log").read_text()[-3000:]
    log = (tmp_path / "second.log").read_text()
    sims = env.simulations()
    assert [o["status"]["phase"] for o in sims] == ["Succeeded"] * 2, log[-3000:]
    for o in sims:
        name = o["metadata"]["name"]
        if launched.get(name):
            assert f"adopted {name}" in log
            assert o["status"]["simId"] == launched[name]  # the same simulation, not a relaunch
        assert o["status"]["restarts"] == 0
    # exactly one run per simulation, each completed: nothing launched twice or lost
    runs = env.runs()
    assert len(runs) == 2 and len({r[2] for r in runs}) == 2, runs
    assert [r[1] for r in runs] == ["completed"] * 2, runs


def test_only_the_lease_holder_acts(env: Env, tmp_path: Path) -> None:
    made = env.cli("submit", "pitzDaily", "--backend", "kubernetes", "--ranks", "2",
                   "--iterations", "100", "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    leader = env.operator("--identity", "leader", "--until-idle", log=tmp_path / "leader.log")
    env.wait("the leader to claim", lambda: env.phases() != ["Queued"] and env.phases() != ["-"],
             120)  # fmt: skip
    follower = env.operator("--identity", "follower", log=tmp_path / "follower.log")
    assert leader.wait(timeout=300) == 0, (tmp_path / "leader.log").read_text()[-3000:]
    (o,) = env.simulations()
    assert o["status"]["phase"] == "Succeeded" and o["status"]["operator"] == "leader"
    text = (tmp_path / "follower.log").read_text()
    assert "waiting for the lease" in text
    follower.send_signal(signal.SIGTERM)
    follower.wait(timeout=60)
