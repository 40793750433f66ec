"""`rankpack dashboard`'s server over loopback (issue 42), in this process: the real poller,
server and `SimulationApi` over `FakeKubeApi`, the apiserver boundary (tests/fakeapi.py,
scripted by tests/dashboard_script.py), holding Simulations of the user's namespace and of
another.

The page and its data only under the secret path and for a loopback Host, with the strict
CSP on every answer, GET only; the data holds the user's namespace only; credentials
refused mid-way show nothing read before, an apiserver away keeps the last view with the
error; the command itself serves until SIGINT, and its bad arguments and a port in use are
a one-line error, exit 2. The page in a browser: tests/integration/test_dashboard_browser.py.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from rankpack.cli import dashboard_cmd, main
from rankpack.cli.dashboard_cmd import CSP, DashboardPoller, DashboardServer
from rankpack.errors import UserError
from rankpack.operator import crd
from tests.dashboard_script import OTHER, OWN, QUEUED, RUNNING, SECRET, ScriptedCluster

SIMS_PATH = f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{OWN}/{crd.PLURAL}"


@pytest.fixture
def served() -> Iterator[tuple[ScriptedCluster, DashboardPoller, DashboardServer]]:
    cluster = ScriptedCluster(nodes_readable=True)
    poller = DashboardPoller(cluster.api, OWN, 5.0, clock=lambda: 1000.0 + cluster.steps * 5)
    poller.first()
    server = DashboardServer(poller, 0)
    server.start()
    try:
        yield cluster, poller, server
    finally:
        server.shutdown()
        server.server_close()


def get(server: DashboardServer, path: str, host: str | None = None,
        method: str = "GET") -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.putrequest(method, path, skip_host=True)
        conn.putheader("Host", host or f"127.0.0.1:{server.port}")
        conn.endheaders()
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def view(server: DashboardServer) -> Any:
    status, headers, body = get(server, f"/{server.token}/api/view")
    assert status == 200 and headers["Content-Type"] == "application/json"
    return json.loads(body)


def test_the_page_and_its_data_under_the_secret_path_only(
    served: tuple[ScriptedCluster, DashboardPoller, DashboardServer],
) -> None:
    server = served[2]
    assert server.url == f"http://127.0.0.1:{server.port}/{server.token}/"
    assert len(server.token) >= 24
    status, headers, body = get(server, f"/{server.token}/")
    assert status == 200 and b'<script src="dashboard.js"' in body
    assert headers["Content-Security-Policy"] == CSP and "'unsafe-inline'" not in CSP
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer"
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css"),
                       ("icon.svg", "image/svg+xml")):  # fmt: skip
        status, headers, body = get(server, f"/{server.token}/{name}")
        assert status == 200 and headers["Content-Type"].startswith(kind) and body
        assert headers["Content-Security-Policy"] == CSP
    # no token, a wrong one, a path beside the page: not found; another Host (a page the
    # browser has open, its name rebound to 127.0.0.1): refused; anything but GET: refused
    for path in ("/", "/api/view", f"/{server.token[:-1]}x/api/view", f"/{server.token}/x",
                 f"/{server.token}/../{server.token}/api/view"):  # fmt: skip
        status, headers, body = get(server, path)
        assert status == 404 and OWN.encode() not in body, path
    status, _, _ = get(server, f"/{server.token}/api/view", host=f"evil.test:{server.port}")
    assert status == 403
    status, _, _ = get(server, f"/{server.token}/api/view", method="POST")
    assert status == 405
    status, _, body = get(server, f"/{server.token}/api/view", method="HEAD")
    assert status == 200 and body == b""


def test_the_data_holds_the_users_namespace_and_grows_with_each_poll(
    served: tuple[ScriptedCluster, DashboardPoller, DashboardServer],
) -> None:
    cluster, poller, server = served
    first = view(server)
    for _ in range(4):
        cluster.step()
        poller.poll()
    data = view(server)
    assert data["namespace"] == OWN and data["error"] is None
    assert [s["name"] for s in data["simulations"]] == [RUNNING, QUEUED]
    assert {s["namespace"] for s in data["simulations"]} == {OWN}
    text = json.dumps(data)
    assert SECRET not in text and OTHER not in text
    run0 = first["simulations"][0]
    run = data["simulations"][0]
    assert len(run["residuals"]["points"]) == len(run0["residuals"]["points"]) + 4
    assert len(run["heat"]["columns"]) == len(run0["heat"]["columns"]) + 4 == 5
    assert run["residuals"]["fields"] == ["Ux", "Uy", "epsilon", "k", "p"]
    # its resize (the 4th step's); the other namespace's, on the same step, is not its own
    assert [(e["reason"], e["message"][:6]) for e in run["recent"]] == [("Resized", "rank 3")]
    assert data["nodes"][0]["name"] == "node-1"  # these credentials may read nodes
    assert data["polledAt"] == 1020.0


def test_refused_credentials_show_nothing_read_before_and_an_unreachable_apiserver_keeps_it(
    served: tuple[ScriptedCluster, DashboardPoller, DashboardServer],
) -> None:
    cluster, poller, server = served
    cluster.fake.down = True
    poller.poll()
    data = view(server)
    assert [s["name"] for s in data["simulations"]] == [RUNNING, QUEUED]
    assert "cannot list Simulations" in data["error"] and data["polledAt"] == 1000.0
    cluster.fake.down = False
    cluster.fake.forbid_paths.add(SIMS_PATH)
    poller.poll()
    data = view(server)
    assert data["simulations"] == [] and data["nodes"] is None
    assert "403" in data["error"] and "Forbidden" in data["error"]
    cluster.fake.forbid_paths.clear()
    poller.poll()
    assert [s["name"] for s in view(server)["simulations"]] == [RUNNING, QUEUED]
    assert view(server)["error"] is None


def test_simulations_that_may_not_be_listed_at_start_are_a_user_error() -> None:
    cluster = ScriptedCluster()
    cluster.fake.forbid_paths.add(SIMS_PATH)
    with pytest.raises(UserError, match="cannot list Simulations: 403 Forbidden"):
        DashboardPoller(cluster.api, OWN, 5.0).first()


def test_the_command_serves_until_sigint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = ScriptedCluster()
    monkeypatch.setattr(dashboard_cmd, "simulation_api", lambda args: cluster.api)
    started: list[DashboardServer] = []
    seen: list[Any] = []
    real_start = DashboardServer.start

    def start(self: DashboardServer) -> threading.Thread:
        started.append(self)
        return real_start(self)

    def user() -> None:  # the user's browser, then Ctrl-C
        try:
            while not started:
                threading.Event().wait(0.02)
            seen.append(view(started[0]))
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(DashboardServer, "start", start)
    threading.Thread(target=user, daemon=True).start()
    code = main(["dashboard", "--interval", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith(f"rankpack dashboard: {started[0].url} ")
    assert [s["name"] for s in seen[0]["simulations"]] == [RUNNING, QUEUED]
    with pytest.raises(urllib.error.URLError):  # stopped
        urllib.request.urlopen(started[0].url, timeout=2)


@pytest.mark.parametrize(
    "argv",
    [["--interval", "0"], ["--interval", "3601"], ["--interval", "nan"], ["--port", "-1"],
     ["--port", "65536"], ["--port", "x"], ["--kubeconfig", "/nonexistent/kubeconfig"]],
)  # fmt: skip
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboard", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_a_port_in_use_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = ScriptedCluster()
    monkeypatch.setattr(dashboard_cmd, "simulation_api", lambda args: cluster.api)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["dashboard", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err == f"rankpack: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
