"""The node agent's HTTP API in-process on 127.0.0.1 (an ephemeral port, a thread: no
process), over fakes of a node's filesystems and of the apiserver's reviews; and the
backend's client of it (`agents.AgentReadings`) against that server."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.nodes.agents import AgentReadings, agent_addresses
from rankpack.backend.kubernetes.nodes.nodereader import CpuCounters, NodeReader
from rankpack.backend.kubernetes.nodes.readings import ReadingsMissing
from rankpack.backend.mpirun import ShimSample
from rankpack.backend.protocol import BackendError
from rankpack.nodeagent.auth import ApiReviewer, Authorizer
from rankpack.nodeagent.server import AgentServer
from rankpack.nodeagent.service import MAX_BODY, NodeAgent, RankPods, Response
from rankpack.profile.records import read_record
from tests.fakeapi import CREATOR, OPERATOR, SCRAPER, FakeKubeApi
from tests.fakeclock import FakeClock
from tests.unit.backend.kubernetes.fakenode import (
    FakeNodeFilesystems,
    new_uid,
    rank_pod_object,
    record_bytes,
)

Obj = dict[str, Any]


@dataclass
class Node:
    """One node: its fake filesystems, its rank pods, its agent serving on 127.0.0.1."""

    files: FakeNodeFilesystems
    pods: list[Obj]
    agent: NodeAgent
    server: AgentServer
    reviews: FakeKubeApi
    """The apiserver the agent's reviews go to."""
    handled: list[str]
    lists: list[int]

    def request(
        self, method: str, path: str, token: str | None = OPERATOR, body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:  # fmt: skip
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=5)
        hdrs = dict(headers or {})
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=body, headers=hdrs)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, data

    def record(self, pod: Obj) -> Path:
        uid, rank = pod["metadata"]["uid"], pod["metadata"]["labels"]["rankpack.dev/rank"]
        return self.files.live_dir(uid) / f"rank-{rank}.rec"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    files = FakeNodeFilesystems(tmp_path)
    pods = []
    for sim, rank, ns in (("s1", 0, "runs"), ("s1", 1, "runs"), ("s2", 0, "runs"),
                          ("s3", 0, "other")):  # fmt: skip
        uid = new_uid()
        pods.append(rank_pod_object(uid, sim, rank, namespace=ns))
        files.add_cgroup(
            uid, usage_ns=(rank + 1) * 10**9, nr_throttled=rank, throttled_ns=rank * 1000
        )
        published = sim != "s2"  # s2's rank has not called MPI_Init yet
        files.write_record(
            uid,
            rank,
            record_bytes(
                rank, seq=2 if published else 0, compute_ns=300, mpi_ns=100, window=(3, 1)
            ),
        )
    pods.append(rank_pod_object(new_uid(), "s4", phase="Pending", namespace="runs"))
    weird = rank_pod_object("not-a-uuid", "s5", namespace="runs")
    pods.append(weird)
    lists: list[int] = []

    def list_pods() -> list[Obj]:
        lists.append(1)
        return [dict(p) for p in pods]

    reviews = FakeKubeApi()
    reader = NodeReader(files.kubelet_root, files.cgroup_root, files.pods_cgroup)
    agent = NodeAgent("node-1", reader, RankPods(list_pods), Authorizer(ApiReviewer(reviews)),
                      wall=lambda: 1_700_000_000.0)  # fmt: skip
    handled: list[str] = []
    handle = agent.handle

    def counting(method: str, target: str, auth: str | None, body: bytes | None) -> Response:
        handled.append(f"{method} {target}")
        return handle(method, target, auth, body)

    agent.handle = counting  # type: ignore[method-assign]
    server = AgentServer(("127.0.0.1", 0), agent)
    server.start()
    yield Node(files, pods, agent, server, reviews, handled, lists)
    server.shutdown()
    server.server_close()


# -- the API --------------------------------------------------------------------------------


def test_healthz_needs_no_token(node: Node) -> None:
    assert node.request("GET", "/healthz", token=None) == (200, b"ok\n")
    assert node.reviews.tokens_reviewed == []


def test_ranks_401_403_200(node: Node) -> None:
    assert node.request("GET", "/v1/ranks?namespace=runs", token=None)[0] == 401
    assert node.request("GET", "/v1/ranks?namespace=runs", token="forged")[0] == 401
    status, body = node.request("GET", "/v1/ranks?namespace=runs", token=CREATOR)
    assert status == 403 and b"may not get ranks.rankpack.dev" in body
    assert node.request("GET", "/v1/ranks", token=OPERATOR)[0] == 403  # every namespace
    status, body = node.request("GET", "/v1/ranks?namespace=runs")
    assert status == 200
    data = json.loads(body)
    assert data["node"] == "node-1" and data["time"] == "2023-11-14T22:13:20.000000Z"
    ranks = data["ranks"]
    assert [(r["sim"], r["rank"]) for r in ranks] == [("s1", 0), ("s1", 1), ("s2", 0)]
    first = ranks[0]
    assert first["pod"] == "rankpack-s1-0" and first["namespace"] == "runs"
    assert (first["usage_ns"], first["nr_throttled"], first["throttled_ns"]) == (10**9, 0, 0)
    assert first["psi"] is None
    assert first["shim"] == {"compute_ns": 300, "mpi_ns": 100, "duty_window": 0.75,
                             "wait_mode": "spin"}  # fmt: skip
    assert ranks[2]["shim"] is None  # not published


def test_bad_requests(node: Node) -> None:
    assert node.request("GET", "/v1/ranks?namespace=../x")[0] == 400
    assert node.request("GET", "/v1/ranks?" + "&".join(f"a{i}=1" for i in range(20)))[0] == 400
    assert node.request("GET", "/nope")[0] == 404
    assert node.request("GET", "/v1/ranks/extra")[0] == 404
    assert node.request("POST", "/v1/ranks?namespace=runs", body=b"")[0] == 405
    assert node.request("GET", "/v1/namespaces/runs/simulations/s1/wait-mode")[0] == 405
    assert node.request("PUT", "/v1/namespaces/Runs!/simulations/s1/wait-mode",
                        body=b"{}")[0] == 404  # fmt: skip


def put_mode(node: Node, sim: str, body: bytes, token: str = OPERATOR, ns: str = "runs") -> int:
    return node.request("PUT", f"/v1/namespaces/{ns}/simulations/{sim}/wait-mode", token, body)[0]


def test_wait_mode_sets_every_rank_of_the_simulation_on_this_node(node: Node) -> None:
    assert put_mode(node, "s1", b'{"mode": "polite"}', token=CREATOR) == 403
    assert put_mode(node, "s1", b'{"mode": "polite"}', token="") == 401
    status, body = node.request("PUT", "/v1/namespaces/runs/simulations/s1/wait-mode",
                                body=b'{"mode": "polite"}')  # fmt: skip
    assert status == 200 and json.loads(body) == {"node": "node-1", "mode": "polite",
                                                  "ranks": [0, 1]}  # fmt: skip
    for pod in node.pods[:2]:
        assert read_record(node.record(pod)).wait_mode_requested == "polite"  # type: ignore[union-attr]
    assert read_record(node.record(node.pods[3])).wait_mode_requested == "spin"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("sim", "body", "status"),
    [
        ("s9", b'{"mode": "polite"}', 404),  # no rank of it on this node
        ("s2", b'{"mode": "polite"}', 409),  # a rank's record is not published yet
        ("s1", b'{"mode": "nap"}', 400),
        ("s1", b"polite", 400),
        ("s1", b"[]", 400),
        ("s1", b"", 400),
    ],
)
def test_wait_mode_refusals(node: Node, sim: str, body: bytes, status: int) -> None:
    assert put_mode(node, sim, body) == status
    assert read_record(node.record(node.pods[0])).wait_mode_requested == "spin"  # type: ignore[union-attr]


def test_bodies_are_bounded(node: Node) -> None:
    big = b'{"mode": "polite", "pad": "' + b"x" * MAX_BODY + b'"}'
    assert put_mode(node, "s1", big) == 413
    conn = http.client.HTTPConnection("127.0.0.1", node.server.port, timeout=5)
    conn.putrequest("PUT", "/v1/namespaces/runs/simulations/s1/wait-mode")
    conn.putheader("Authorization", f"Bearer {OPERATOR}")
    conn.endheaders()
    assert conn.getresponse().status == 411  # no Content-Length
    conn.close()


def test_metrics(node: Node) -> None:
    assert node.request("GET", "/metrics", token=None)[0] == 401
    assert node.request("GET", "/metrics", token=OPERATOR)[0] == 403
    node.request("GET", "/v1/ranks?namespace=runs")
    status, body = node.request("GET", "/metrics", token=SCRAPER)
    assert status == 200
    text = body.decode()
    labels = 'namespace="runs",pod="rankpack-s1-1",rank="1",sim="s1"'
    assert f"rankpack_node_rank_cpu_usage_seconds_total{{{labels}}} 2.0" in text
    assert f"rankpack_node_rank_duty_ratio{{{labels}}} 0.75" in text
    assert f'rankpack_node_rank_wait_mode{{mode="spin",{labels}}} 1.0' in text
    assert 'rankpack_node_agent_requests_total{code="200",route="ranks"} 1.0' in text
    assert 'rankpack_node_agent_requests_total{code="401",route="metrics"} 1.0' in text


def test_the_pods_are_listed_at_most_once_a_second(node: Node) -> None:
    for _ in range(5):
        node.request("GET", "/v1/ranks?namespace=runs")
    assert len(node.lists) == 1


# -- the backend's client -------------------------------------------------------------------


def agent_pod(node_name: str, ip: str, *, ready: bool = True, created: str = "1") -> Obj:
    return {
        "metadata": {"name": f"agent-{node_name}-{created}", "namespace": "rankpack",
                     "labels": {"app.kubernetes.io/name": "rankpack-node-agent"},
                     "creationTimestamp": created},
        "spec": {"nodeName": node_name},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }  # fmt: skip


def client(
    node: Node, token: str | None = OPERATOR
) -> tuple[AgentReadings, FakeClock, FakeKubeApi]:
    api = FakeKubeApi(namespace="runs", token=token,
                      other_pods=[agent_pod("node-1", "127.0.0.1")])  # fmt: skip
    clock = FakeClock(1000.0)
    readings = AgentReadings(api, agent_namespace="rankpack", port=node.server.port,
                             clock=clock)  # fmt: skip
    return readings, clock, api


def test_the_client_reads_each_node_once_per_round(node: Node) -> None:
    readings, clock, _ = client(node)
    readings.prefetch(node.pods[:3])
    got = [readings.read(p) for p in node.pods[:3]]
    assert [r.cpu for r in got if r] == [CpuCounters(10**9), CpuCounters(2 * 10**9, 1, 1000),
                                         CpuCounters(10**9)]  # fmt: skip
    assert got[0] is not None and got[0].shim == ShimSample(300, 100, 0.75, "spin")
    assert got[2] is not None and got[2].shim is None
    assert node.handled == ["GET /v1/ranks?namespace=runs"]
    clock.t += 0.6
    readings.read(node.pods[0])
    assert len(node.handled) == 2


def test_the_nodes_whole_cpu_request_is_answered_and_read_by_the_client(node: Node) -> None:
    """Issue 40: what every live pod of the node requests (another tenant's too), a sum;
    the client keeps it for `requests_s` and leaves out a node that does not say."""
    readings, clock, _ = client(node)
    assert readings.node_requests(["node-1"]) == {}  # this agent cannot see its node's pods

    def pod(cpu: str, phase: str = "Running") -> Obj:
        return {"spec": {"containers": [{"resources": {"requests": {"cpu": cpu}}}]},
                "status": {"phase": phase}}  # fmt: skip

    node.agent.pods.list_node = lambda: [pod("1500m"), pod("250m"), pod("2", "Succeeded")]
    status, body = node.request("GET", "/v1/ranks?namespace=runs")
    assert status == 200 and json.loads(body)["requestedMillis"] == 1750
    clock.t += 10.0
    assert readings.node_requests(["node-1", "no-agent-there"]) == {"node-1": 1750}
    asked = len(node.handled)
    clock.t += 1.0
    assert readings.node_requests(["node-1"]) == {"node-1": 1750}
    assert len(node.handled) == asked  # not asked again within requests_s


def test_the_client_sets_wait_modes(node: Node) -> None:
    readings, _, _ = client(node)
    readings.set_wait_mode("s1", node.pods[:2], "adaptive")
    assert node.handled[-1] == "PUT /v1/namespaces/runs/simulations/s1/wait-mode"
    for pod in node.pods[:2]:
        assert read_record(node.record(pod)).wait_mode_requested == "adaptive"  # type: ignore[union-attr]
    with pytest.raises(BackendError, match="not published yet"):
        readings.set_wait_mode("s2", node.pods[2:3], "polite")
    assert not any(h.startswith("PUT") and "s2" in h for h in node.handled)


def test_a_refused_token_is_a_missing_reading(node: Node) -> None:
    readings, _, _ = client(node, token=CREATOR)
    with pytest.raises(ReadingsMissing, match="answered 403"):
        readings.read(node.pods[0])
    readings, _, _ = client(node, token=None)
    with pytest.raises(ReadingsMissing, match="no bearer token"):
        readings.read(node.pods[0])


def test_an_unreachable_agent_is_a_missing_reading_asked_once_per_retry(node: Node) -> None:
    readings, clock, api = client(node)
    node.server.shutdown()
    node.server.server_close()
    with pytest.raises(ReadingsMissing, match="node agent on node-1 unreachable") as caught:
        readings.read(node.pods[0])
    assert caught.value.node == "node-1"
    lists = len([a for a in api.actions if a[:3] == ("list", "pods", "rankpack")])
    with pytest.raises(ReadingsMissing):
        readings.read(node.pods[1])  # the same round: not asked again
    clock.t += readings.retry_s
    with pytest.raises(ReadingsMissing):
        readings.read(node.pods[1])
    # a failed agent is looked up again (it may have been replaced)
    assert len([a for a in api.actions if a[:3] == ("list", "pods", "rankpack")]) > lists


def test_a_node_without_an_agent_is_a_missing_reading(node: Node) -> None:
    readings, _, _ = client(node)
    elsewhere = rank_pod_object(new_uid(), node="node-2", namespace="runs")
    with pytest.raises(ReadingsMissing, match="no running node agent"):
        readings.read(elsewhere)
    assert readings.read({**elsewhere, "spec": {}}) is None  # not on a node yet


def test_agent_addresses_prefer_the_ready_agent() -> None:
    pods = [agent_pod("n1", "10.0.0.1", ready=False, created="2"),
            agent_pod("n1", "10.0.0.2", created="1"), agent_pod("n2", "fd00::5"),
            {**agent_pod("n3", "10.0.0.3"), "status": {"phase": "Pending"}}]  # fmt: skip
    assert agent_addresses(pods, 8475) == {"n1": "10.0.0.2:8475", "n2": "[fd00::5]:8475"}
