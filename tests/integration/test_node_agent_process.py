"""`rankpack node-agent` as a process, against a fake apiserver (HTTP, in this process) and
fakes of a node's filesystems: the REST calls it makes (its node's rank pods, TokenReview,
SubjectAccessReview), its answers, and - as root, under ``setpriv`` - the capability the
DaemonSet gives it: with only DAC_OVERRIDE it writes the wait-mode word of a record that
belongs to uid 1000 behind the kubelet's 0750 root directories; without it, it cannot."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from rankpack.profile.records import read_record
from tests.unit.backend.kubernetes.fakenode import FakeNodeFilesystems, new_uid, rank_pod_object

pytestmark = pytest.mark.integration

AGENT_TOKEN = "agent-token"
USERS = {"operator-token": "system:serviceaccount:rankpack:rankpack-operator",
         "creator-token": "system:serviceaccount:team:submitter"}  # fmt: skip


class FakeApiserver(ThreadingHTTPServer):
    """Pods of one node, TokenReview and SubjectAccessReview; records what it is asked."""

    daemon_threads = True

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.asked: list[str] = []
        super().__init__(("127.0.0.1", 0), _Api)


class _Api(BaseHTTPRequestHandler):
    server: FakeApiserver

    def log_message(self, *args: object) -> None:
        return None

    def _json(self, data: object, status: int = 200) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        self.server.asked.append(f"GET {url.path} {sorted(parse_qs(url.query).items())}")
        if self.headers.get("Authorization") != f"Bearer {AGENT_TOKEN}":
            self._json({"message": "Unauthorized"}, 401)
        elif url.path == "/api/v1/pods":
            self._json({"items": self.server.pods})
        else:
            self._json({"message": "not found"}, 404)

    def do_POST(self) -> None:
        spec = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["spec"]
        self.server.asked.append(f"POST {self.path}")
        if self.path.endswith("/tokenreviews"):
            user = USERS.get(spec["token"])
            status: dict[str, Any] = {"authenticated": bool(user)}
            if user:
                status["user"] = {"username": user, "groups": ["system:authenticated"]}
        else:
            attrs = spec["resourceAttributes"]
            status = {"allowed": spec["user"] == USERS["operator-token"]
                      and attrs["namespace"] == "runs"}  # fmt: skip
        self._json({"status": status}, 201)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ask(port: int, method: str, path: str, token: str | None = None,
        body: bytes | None = None) -> tuple[int, bytes]:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, body=body,
                 headers={"Authorization": f"Bearer {token}"} if token else {})  # fmt: skip
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


class Agent:
    def __init__(self, tmp_path: Path, files: FakeNodeFilesystems, api: FakeApiserver,
                 prefix: list[str]) -> None:  # fmt: skip
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{api.server_port}"}}],
            "users": [{"name": "u", "user": {"token": AGENT_TOKEN}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        }))  # fmt: skip
        kubeconfig.chmod(0o644)
        self.port = free_port()
        self.log = tmp_path / f"agent-{self.port}.log"
        src = str(Path(__file__).resolve().parents[2] / "src")
        env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
        argv = [*prefix, sys.executable, "-m", "rankpack", "node-agent", "--node", "node-1",
                "--port", str(self.port), "--address", "127.0.0.1", "--kubeconfig",
                str(kubeconfig), "--kubelet-root", str(files.kubelet_root), "--cgroup-root",
                str(files.cgroup_root)]  # fmt: skip
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if ask(self.port, "GET", "/healthz")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
            assert self.proc.poll() is None, self.log.read_text()
        raise AssertionError(f"the agent did not answer: {self.log.read_text()}")

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=15)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[FakeNodeFilesystems, FakeApiserver, list[dict]]]:  # type: ignore[type-arg]
    files = FakeNodeFilesystems(tmp_path / "node")
    pods = []
    for rank in range(2):
        uid = new_uid()
        files.add_cgroup(uid, usage_ns=(rank + 1) * 10**9)
        files.write_record(uid, rank, compute_ns=30, mpi_ns=10, window=(3, 1))
        pods.append(rank_pod_object(uid, "s1", rank, namespace="runs"))
    api = FakeApiserver(pods)
    threading.Thread(target=api.serve_forever, args=(0.1,), daemon=True).start()
    yield files, api, pods
    api.shutdown()
    api.server_close()


def test_the_agent_process_serves_its_nodes_ranks(tmp_path: Path, node: Any) -> None:
    files, api, pods = node
    agent = Agent(tmp_path, files, api, [])
    try:
        assert ask(agent.port, "GET", "/v1/ranks?namespace=runs")[0] == 401
        assert ask(agent.port, "GET", "/v1/ranks?namespace=runs", "creator-token")[0] == 403
        status, body = ask(agent.port, "GET", "/v1/ranks?namespace=runs", "operator-token")
        assert status == 200, body
        ranks = json.loads(body)["ranks"]
        assert [(r["rank"], r["usage_ns"], r["shim"]["duty_window"]) for r in ranks] == [
            (0, 10**9, 0.75), (1, 2 * 10**9, 0.75)]  # fmt: skip
        status, body = ask(agent.port, "PUT", "/v1/namespaces/runs/simulations/s1/wait-mode",
                           "operator-token", b'{"mode": "polite"}')  # fmt: skip
        assert status == 200, body
        for pod in pods:
            path = files.live_dir(pod["metadata"]["uid"])
            rank = pod["metadata"]["labels"]["rankpack.dev/rank"]
            assert read_record(path / f"rank-{rank}.rec").wait_mode_requested == "polite"  # type: ignore[union-attr]
    finally:
        assert agent.stop() == 0, agent.log.read_text()
    selector = (
        "GET /api/v1/pods [('fieldSelector', ['spec.nodeName=node-1']), "
        "('labelSelector', ['app.kubernetes.io/managed-by=rankpack,rankpack.dev/rank'])]"
    )
    assert api.asked.count(selector) >= 1  # fmt: skip
    assert "POST /apis/authentication.k8s.io/v1/tokenreviews" in api.asked
    assert "POST /apis/authorization.k8s.io/v1/subjectaccessreviews" in api.asked
    assert "operator-token" not in agent.log.read_text()  # tokens are never logged


def _as_rank_user(files: FakeNodeFilesystems, pods: list[dict]) -> None:  # type: ignore[type-arg]
    """The kubelet's layout: root-owned 0750 directories down to the emptyDir (0777),
    records written by the rank image's user (uid 1000, 0644)."""
    for pod in pods:
        live = files.live_dir(pod["metadata"]["uid"])
        d = live.parent
        while d != files.kubelet_root.parent:
            d.chmod(0o750)
            d = d.parent
        live.chmod(0o777)
        for rec in live.iterdir():
            os.chown(rec, 1000, 1000)
            rec.chmod(0o644)


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)


@needs_root
@pytest.mark.parametrize(("caps", "status"), [("+dac_override", 200), ("", 409)],
                         ids=["dac-override", "no-capabilities"])  # fmt: skip
def test_dac_override_is_the_capability_the_agent_needs(
    tmp_path: Path, node: Any, caps: str, status: int
) -> None:
    files, api, pods = node
    _as_rank_user(files, pods)
    tmp_path.chmod(0o755)
    caps_arg = f"-all{',' + caps if caps else ''}"
    prefix = ["setpriv", f"--inh-caps={caps_arg}", f"--ambient-caps={caps_arg}",
              f"--bounding-set={caps_arg}", "--"]  # fmt: skip
    agent = Agent(tmp_path, files, api, prefix)
    try:
        got, body = ask(agent.port, "PUT", "/v1/namespaces/runs/simulations/s1/wait-mode",
                        "operator-token", b'{"mode": "polite"}')  # fmt: skip
        assert got == status, body
        # reading needs no capability: root owns the kubelet's directories, records are 0644
        got, body = ask(agent.port, "GET", "/v1/ranks?namespace=runs", "operator-token")
        assert got == 200 and all(r["shim"] for r in json.loads(body)["ranks"]), body
    finally:
        agent.stop()
