"""One run of ``bench/cost.py``'s ``k8s-sim-w``: a Simulation on the in-cluster operator.

The dev cluster must be up with its operator (``rankpack dev-cluster up --operator``): the
operator and the node agent run as pods from the real images, the rank pods the operator
creates run the real rank image. `restricted` labels the users' namespace PodSecurity
``enforce=restricted`` for each run (``deploy/dev`` relaxes it for the dev image that
``rankpack run --backend kubernetes`` uses; restored after), so every pod of the run is
admitted as on a cluster. `run_simulation` copies the case into the
operator's runs volume, creates the Simulation (weights 1:1:5:15, budget 2 cores, the
iterations asked for), follows its status once a second (the admin's client, no kubectl
process in the measured time) and returns the operator's own ``wallSeconds`` and the
start-up: from the controller's launch decision (the ``launch`` event's ``decided_unix`` in
the operator's database) to the first ``Time =`` line of the solver's log (watched every
10 ms on the runs volume's host directory).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rankpack.devcluster import deploy
from rankpack.devcluster.layout import NAMESPACE, Layout, default_state_dir
from rankpack.operator import crd, manifests

ENFORCE = "pod-security.kubernetes.io/enforce"
TIMEOUT_S = 900.0
CLOCK = re.compile(r"ExecutionTime = ([\d.]+) s\s+ClockTime = ([\d.]+) s")


def _custom() -> Any:
    from kubernetes import client, config

    api = config.new_client_from_config(
        config_file=str(Layout(default_state_dir()).admin_kubeconfig)
    )
    return client.CustomObjectsApi(api), client.CoreV1Api(api)


@contextlib.contextmanager
def restricted(core: Any) -> Iterator[None]:
    """The users' namespace at PodSecurity ``restricted`` while a run runs."""
    patch = {"metadata": {"labels": {ENFORCE: "restricted"}}}
    old = (core.read_namespace(NAMESPACE).metadata.labels or {}).get(ENFORCE)
    core.patch_namespace(NAMESPACE, patch)
    try:
        yield
    finally:
        core.patch_namespace(NAMESPACE, {"metadata": {"labels": {ENFORCE: old}}})


def _chown(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        os.chown(path, manifests.RUN_AS, manifests.RUN_AS, follow_symlinks=False)


def _dirs(root: Path) -> set[Path]:
    """The directories one and two levels below ``root`` (but the cases)."""
    out: set[Path] = set()
    with contextlib.suppress(OSError):
        for top in os.scandir(root):
            if top.is_dir(follow_symlinks=False) and top.name != "cases":
                out.add(Path(top.path))
                with contextlib.suppress(OSError):
                    out |= {Path(d.path) for d in os.scandir(top.path)
                            if d.is_dir(follow_symlinks=False)}  # fmt: skip
    return out


def clock_time(log: Path | None) -> float | None:
    """The solver's own last ``ClockTime`` in ``log`` (whole seconds), None if none."""
    if log is None or not log.exists():
        return None
    found = CLOCK.findall(log.read_text(errors="replace"))
    return float(found[-1][1]) if found else None


def solver_s(watch: FirstLine) -> float | None:
    """From the solver log's first ``Time =`` line to its last write (its mtime), seconds:
    the solver's own wall, start-up and end detection left out."""
    if watch.at is None or watch.log is None or not watch.log.exists():
        return None
    return round(watch.log.stat().st_mtime - watch.at, 3)


class FirstLine(threading.Thread):
    """Notes the wall time at which the first ``Time =`` line appears in the solver log
    that ``find`` finds (None: not there yet), polled every 10 ms."""

    def __init__(self, find: Callable[[], Path | None]) -> None:
        super().__init__(daemon=True)
        self.find = find
        self.at: float | None = None
        self.log: Path | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        log: Path | None = None
        while not self.stop.is_set() and self.at is None:
            log = log or self.find()
            self.log = log
            if log is not None:
                with contextlib.suppress(OSError):
                    if b"\nTime = " in log.read_bytes():
                        self.at = time.time()
            time.sleep(0.01)


def new_run_log(root: Path) -> Callable[[], Path | None]:
    """Finds the solver log of a run directory that appears below ``root`` from now on."""
    before = _dirs(root)

    def find() -> Path | None:
        new = [d / "log.simpleFoam" for d in _dirs(root) - before]
        return next((f for f in new if f.exists()), None)

    return find


def decided(db: Path, sim_id: str | None = None) -> float | None:
    """When the controller decided to launch ``sim_id`` (the latest launch if None), wall
    time, from the ``launch`` event in its database."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = conn.execute(
            "SELECT detail_json FROM events WHERE kind = 'launch' ORDER BY id DESC"
        ).fetchall()
    for (detail,) in rows:
        data = json.loads(detail)
        if (sim_id is None or data.get("sim") == sim_id) and "decided_unix" in data:
            return float(data["decided_unix"])
    return None


def run_simulation(source: Path, ranks: int, iterations: int) -> dict[str, object]:
    custom, core = _custom()
    with restricted(core):  # (``rankpack run --backend kubernetes``'s dev image is not)
        return _run_simulation(custom, source, ranks, iterations)


def _run_simulation(custom: Any, source: Path, ranks: int, iterations: int) -> dict[str, object]:
    name = f"cost-{uuid.uuid4().hex[:8]}"
    cases = deploy.runs_dir() / "namespaces" / NAMESPACE / "cases"  # the users' part
    cases.mkdir(exist_ok=True)
    os.chown(cases, manifests.RUN_AS, manifests.RUN_AS)
    # The case under its own directory name, as `rankpack run` is given it: the operator
    # learns a case's sizes by that name (`controller.learned`), so from the second
    # repetition on both sides start at the sizes the first one measured.
    case = cases / source.name
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(source, case, symlinks=True)
    _chown(case)
    path = manifests.tenant_path(NAMESPACE, f"cases/{source.name}")
    body = {
        "apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": {"name": name},
        "spec": {"case": {"path": path}, "ranks": ranks,
                 "weights": [1, 1, 5, 15][:ranks], "budgetMillis": 2000,
                 "iterations": iterations},
    }  # fmt: skip
    watch = FirstLine(new_run_log(Path(manifests.DEV_RUNS_DIR) / "namespaces" / NAMESPACE))
    watch.start()
    custom.create_namespaced_custom_object(crd.GROUP, crd.VERSION, NAMESPACE, crd.PLURAL, body)
    deadline = time.monotonic() + TIMEOUT_S
    status: dict[str, Any] = {}
    try:
        while time.monotonic() < deadline:
            obj = custom.get_namespaced_custom_object(crd.GROUP, crd.VERSION, NAMESPACE,
                                                      crd.PLURAL, name)  # fmt: skip
            status = obj.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            time.sleep(1.0)
        watch.stop.set()
        first = watch.at
        result = status.get("result") or {}
        at = decided(Path(manifests.DEV_RUNS_DIR) / "operator.db", str(status.get("simId") or ""))
        ok = status.get("phase") == "Succeeded"
        return {
            "status": "completed" if ok else f"{status.get('phase')}: {status.get('message')}",
            "wall_s": result.get("wallSeconds") if ok else None,
            "clock_s": clock_time(watch.log),
            "solver_s": solver_s(watch),
            "cpu_s": result.get("cpuSeconds"),
            "startup_s": None if first is None or at is None else round(first - at, 3),
        }
    finally:
        with contextlib.suppress(Exception):
            custom.delete_namespaced_custom_object(crd.GROUP, crd.VERSION, NAMESPACE,
                                                   crd.PLURAL, name)  # fmt: skip
        shutil.rmtree(case, ignore_errors=True)
