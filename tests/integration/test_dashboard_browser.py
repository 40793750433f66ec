"""`rankpack dashboard`'s page in a real browser (headless Debian Chromium, tests/browser.py):
the command as a user starts it (a child process, `tests.dashboard_script.dashboard_process`)
with a kubeconfig of an HTTP apiserver fake (tests/fakeapiserver.py: the real client talks
to it) serving a scripted sequence of Simulation statuses (tests/dashboard_script.py:
Simulations of the user's namespace and of another, moved on every 0.5 s as the operator's
status writes would).

Between two screenshots a few seconds apart the residual curve and the duty heat map of
the running Simulation grow; no console error (the page's strict CSP would report a
violation as one); nothing fetched but the server's own URLs; nothing of the other
namespace on the page or in its data; Ctrl-C (SIGINT) stops the command, exit 0. The same
check against the dev cluster, 10 s apart, is in tests/k8s/test_operator_in_cluster.py.
About 20 s on 2 cores (most of it starting the command and Chromium).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import CHROMIUM, DASHBOARD_CHECKS, blank_fraction, session
from tests.dashboard_script import (
    OTHER,
    OWN,
    QUEUED,
    RUNNING,
    SECRET,
    ScriptedCluster,
    dashboard_process,
)
from tests.fakeapiserver import FakeApiserver

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (setup.sh test)"),
]

STEP_S = 0.5
GAP_S = 3.0


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[tuple[ScriptedCluster, Path]]:
    """The scripted cluster served over HTTP, moving on every `STEP_S`; a kubeconfig of it
    in namespace `OWN`."""
    cluster = ScriptedCluster()
    server = FakeApiserver(cluster.fake).start()
    stop = threading.Event()

    def operator() -> None:
        while not stop.wait(STEP_S):
            cluster.step()

    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    try:
        yield cluster, server.kubeconfig(tmp_path / "kubeconfig", str(cluster.fake.token), OWN)
    finally:
        stop.set()
        thread.join(10)
        server.stop()


def _running(state: dict[str, Any]) -> dict[str, Any]:
    (sim,) = [s for s in state["sims"] if s["name"] == RUNNING]
    return sim


def test_the_page_grows_between_two_screenshots_and_shows_one_namespace(
    kubeconfig: tuple[ScriptedCluster, Path], tmp_path: Path
) -> None:
    cluster, config = kubeconfig
    with dashboard_process(config) as (url, proc), session(width=1280, height=1000) as b:
        b.open(url)
        ready = "document.querySelector('section.sim[data-residual-points]') !== null"
        assert b.wait_for(ready, 20), b.errors
        first = json.loads(b.evaluate(DASHBOARD_CHECKS))
        shot1 = b.screenshot()
        time.sleep(GAP_S)
        second = json.loads(b.evaluate(DASHBOARD_CHECKS))
        shot2 = b.screenshot()
        errors, requests = b.errors, b.requests
        with urllib.request.urlopen(f"{url}api/view", timeout=10) as r:
            data = r.read().decode()
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    (tmp_path / "dashboard-1.png").write_bytes(shot1)
    (tmp_path / "dashboard-2.png").write_bytes(shot2)
    a1, a2 = _running(first), _running(second)
    print(f"{GAP_S:g} s apart: residual points {a1['points']} -> {a2['points']}, heat-map "
          f"columns {a1['columns']} -> {a2['columns']}; screenshots in {tmp_path}")  # fmt: skip
    assert errors == [], errors
    assert a2["points"] > a1["points"] >= 1 and a2["columns"] > a1["columns"] >= 1, (a1, a2)
    assert a2["lines"] >= 5  # a curve per field (5) and the usage sums
    assert a2["cells"] >= 4 * a2["columns"]  # 4 ranks a column
    assert second["polls"] > first["polls"]
    # the queue: both of the user's Simulations, nothing of the other namespace
    assert sorted(second["rows"]) == sorted([RUNNING, QUEUED]), second["rows"]
    assert {s["namespace"] for s in second["sims"]} == {OWN}
    for state in (first, second):
        assert SECRET not in state["text"] and OTHER not in state["text"]
    assert f"namespace {OWN}" in second["source"] and second["status"] == ""
    assert "may not read nodes" in second["text"]
    assert "no estimate yet" in second["text"]  # seconds of watching: no gain claimed
    # the page and its data from the server's own URLs only
    origin = url.rsplit("/", 2)[0]
    assert requests and all(u.startswith(origin) for u in requests), requests
    assert OTHER not in data and SECRET not in data
    assert cluster.steps > 0
    for shot in (shot1, shot2):
        same, colours = blank_fraction(shot)
        assert same < 0.9 and colours > 50, (same, colours)
