"""`rankpack node-agent` as a process, against the HTTP apiserver fake (`tests.fakeapiserver`
over `tests.fakeapi`, in this process) and fakes of a node's filesystems: the REST calls it
makes (its node's rank pods, TokenReview, SubjectAccessReview), its answers, and - as root,
under ``setpriv`` - the capability the DaemonSet gives it for the wait-mode word (its other,
SYS_NICE, is for group pods' nice values): with only DAC_OVERRIDE it writes the wait-mode
word of a record that belongs to uid 1000 behind the kubelet's 0750 root directories;
without it, it cannot."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rankpack.profile.records import read_record
from tests.fakeapi import FakeKubeApi
from tests.fakeapiserver import FakeApiserver
from tests.unit.backend.kubernetes.fakenode import FakeNodeFilesystems, new_uid, rank_pod_object

pytestmark = pytest.mark.integration

AGENT_TOKEN = "agent-token"


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
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", token=AGENT_TOKEN)
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
def agent_node(tmp_path: Path) -> Iterator[tuple[FakeNodeFilesystems, FakeApiserver, list[dict]]]:  # type: ignore[type-arg]
    files = FakeNodeFilesystems(tmp_path / "node")
    pods = []
    for rank in range(2):
        uid = new_uid()
        files.add_cgroup(uid, usage_ns=(rank + 1) * 10**9)
        files.write_record(uid, rank, compute_ns=30, mpi_ns=10, window=(3, 1))
        pods.append(rank_pod_object(uid, "s1", rank, namespace="runs"))
    api = FakeApiserver(FakeKubeApi(token=AGENT_TOKEN, other_pods=pods)).start()
    yield files, api, pods
    api.stop()


def test_the_agent_process_serves_its_nodes_ranks(tmp_path: Path, agent_node: Any) -> None:
    files, api, pods = agent_node
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
    asked = [(s.method, s.path, s.query) for s in api.seen]
    labels = "app.kubernetes.io/managed-by=rankpack"  # rank and group pods: kept by label
    selector = {"fieldSelector": "spec.nodeName=node-1", "labelSelector": labels}
    assert asked.count(("GET", "/api/v1/pods", selector)) >= 1
    assert ("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {}) in asked
    assert ("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {}) in asked
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
    tmp_path: Path, agent_node: Any, caps: str, status: int
) -> None:
    files, api, pods = agent_node
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
