"""A scripted cluster for `rankpack dashboard`'s tests: the real `SimulationApi` of namespace
``team-a`` over `FakeKubeApi` (the apiserver boundary, tests/fakeapi.py), holding
Simulations of ``team-a`` and of ``team-b``; each `step` moves them on as the operator's
status writes would (iterations, residuals falling, each rank's duty, CPU and request, a
resize Event now and then).

``team-a``: ``wing`` runs (4 ranks weighted 1,1,5,15 as `rankpack plan` gives them for
2 cores), ``later`` is queued. ``team-b`` (another user's, never to be shown): ``secret-b``
runs with residuals and duty cycles of its own.

`dashboard_process`: ``rankpack dashboard`` as a user starts it, a child process with a
kubeconfig (the integration tier's against this cluster served over HTTP, the k8s tier's
against the dev cluster).
"""

from __future__ import annotations

import math
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankpack.operator.simapi import SimulationApi
from tests.fakeapi import FakeKubeApi

OWN, OTHER = "team-a", "team-b"
RUNNING, QUEUED, SECRET = "wing", "later", "secret-b"
REQUESTS = (91, 91, 455, 1363)
DUTY = (0.12, 0.14, 0.55, 0.97)


def _ranks(step: int, scale: float = 1.0) -> list[dict[str, Any]]:
    wobble = [0.05 * math.sin(step / 3 + r) for r in range(4)]
    return [{"rank": r, "node": "node-1", "requestMillis": REQUESTS[r],
             "cpuCores": round(min(1.0, DUTY[r] * scale + 0.05 + wobble[r]), 3),
             "duty": round(min(1.0, max(0.0, DUTY[r] * scale + wobble[r])), 4),
             "wait": {"mode": "polite" if r < 2 else "spin"}} for r in range(4)]  # fmt: skip


def _residuals(iterations: int) -> dict[str, float]:
    fall = math.exp(-iterations / 400)
    return {
        f: float(f"{v * fall * (1 + 0.1 * math.sin(iterations / 17)):.3g}")
        for f, v in (("Ux", 0.2), ("Uy", 0.5), ("p", 0.9), ("k", 0.1), ("epsilon", 0.05))
    }


@dataclass
class ScriptedCluster:
    nodes_readable: bool = False
    fake: FakeKubeApi = field(init=False)
    api: SimulationApi = field(init=False)
    steps: int = 0

    def __post_init__(self) -> None:
        self.fake = FakeKubeApi(namespace=OWN, forbid_nodes=not self.nodes_readable)
        self.fake.nodes = [{"metadata": {"name": "node-1"},
                            "status": {"allocatable": {"cpu": "2"}}}]  # fmt: skip
        self.fake.add_simulation(OWN, RUNNING, status=self._status(RUNNING, 0))
        self.fake.add_simulation(OWN, QUEUED, status={"phase": "Queued"})
        self.fake.add_simulation(OTHER, SECRET, status=self._status(SECRET, 0))
        self.api = SimulationApi(self.fake, OWN)  # type: ignore[arg-type]

    def _status(self, name: str, step: int) -> dict[str, Any]:
        iterations = 20 + 25 * step
        scale = 0.6 if name == SECRET else 1.0
        ranks = _ranks(step, scale)
        duties = [r["duty"] for r in ranks]
        return {"phase": "Running", "iterations": iterations, "expectedIterations": 1000,
                "progress": f"{iterations}/1000", "residuals": _residuals(iterations),
                "ranks": ranks, "resizes": step // 4, "nodes": "node-1",
                "duty": {"mean": round(sum(duties) / 4, 3), "min": min(duties)},
                "efficiency": round(sum(duties) / (sum(REQUESTS) / 1000), 3)}  # fmt: skip

    def step(self) -> None:
        """The operator's next status write of each running Simulation."""
        self.steps += 1
        for ns, name in ((OWN, RUNNING), (OTHER, SECRET)):
            obj = self.fake.simulations[ns][name]
            obj["status"] = self._status(name, self.steps)
            if self.steps % 4 == 0:
                self.fake.events.append({
                    "metadata": {"name": f"{name}.{self.steps}", "namespace": ns},
                    "involvedObject": {"kind": "Simulation", "name": name, "namespace": ns,
                                       "uid": obj["metadata"]["uid"]},
                    "reason": "Resized", "lastTimestamp": f"2026-01-01T01:00:{self.steps:02d}Z",
                    "message": f"rank 3 {1363 + self.steps}m -> {1300 + self.steps}m: duty",
                })  # fmt: skip


@contextmanager
def dashboard_process(
    kubeconfig: Path, interval_s: float = 1.0
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``rankpack dashboard --port 0`` as a child process with ``kubeconfig``'s rights:
    (the URL it printed, the process); stopped with SIGINT (Ctrl-C) afterwards, within 30 s
    (else killed, and an AssertionError)."""
    argv = [sys.executable, "-m", "rankpack", "dashboard", "--kubeconfig", str(kubeconfig),
            "--port", "0", "--interval", f"{interval_s:g}"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []
        out = proc.stdout
        assert out is not None
        reader = threading.Thread(target=lambda: lines.append(out.readline()), daemon=True)
        reader.start()
        reader.join(60)
        url = re.match(r"rankpack dashboard: (http://127\.0\.0\.1:\d+/[\w-]+/) ", "".join(lines))
        if url is None:
            proc.kill()
            raise AssertionError(
                f"no URL from rankpack dashboard: {lines} {proc.communicate(timeout=10)}"
            )
        yield url.group(1), proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise AssertionError("rankpack dashboard did not stop on SIGINT") from None
