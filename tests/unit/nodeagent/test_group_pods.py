"""The node agent and group pods (decision 0012), in-process on 127.0.0.1: ``/v1/ranks`` has
an entry per rank, ``PUT .../pods/POD/nices`` sets a group pod's ranks' nice values (on this
test's own process, found through fake ``/proc`` and cgroup trees); and the backend's
client of it (`agents.AgentReadings`) reading and renicing a group pod's ranks."""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rankpack.backend.kubernetes.nodes.agents import AgentReadings
from rankpack.backend.kubernetes.nodes.nodereader import NodeReader
from rankpack.backend.protocol import BackendError
from rankpack.backend.ranknice import set_nice
from rankpack.nodeagent.auth import ApiReviewer, Authorizer
from rankpack.nodeagent.server import AgentServer
from rankpack.nodeagent.service import NodeAgent, RankPods, parse_nices
from rankpack.quantities import MAX_RANKS
from tests.fakeapi import CREATOR, OPERATOR, FakeKubeApi
from tests.fakeclock import FakeClock
from tests.unit.backend.kubernetes.fakenode import (
    FakeNodeFilesystems,
    FakeProc,
    group_pod_object,
    new_uid,
    rank_pod_object,
)

Obj = dict[str, Any]
GONE = int(Path("/proc/sys/kernel/pid_max").read_text()) + 7
"""Rank 0's host pid: in the fake /proc only (pids are below pid_max), never a real one."""


@dataclass
class GroupNode:
    pods: list[Obj]
    """A group pod of ranks 0-3 (rank 1 is this process), an old rank pod, a launcher."""
    agent: NodeAgent
    server: AgentServer
    me: int

    def request(
        self, method: str, path: str, body: bytes | None = None, token: str | None = OPERATOR
    ) -> tuple[int, Obj]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=5)
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, json.loads(data) if data.startswith(b"{") else {}

    def put_nices(self, pod: str, body: Obj | bytes, **kw: Any) -> tuple[int, Obj]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.request("PUT", f"/v1/namespaces/runs/pods/{pod}/nices", data, **kw)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[GroupNode]:
    files = FakeNodeFilesystems(tmp_path)
    proc = FakeProc(tmp_path / "proc")
    group, old = new_uid(), new_uid()
    files.add_cgroup(group, usage_ns=8 * 10**9, nr_throttled=3, throttled_ns=70_000)
    files.add_cgroup(old, usage_ns=10**9)
    me = os.getpid()
    proc.add(GONE, (7,), utime=100, stime=0)
    proc.add(me, (8,), starttime=5)
    files.add_procs(group, [GONE, me])
    files.write_pid(group, 0, "7\n")
    files.write_pid(group, 1, "8\n")
    for rank in range(4):
        files.write_record(group, rank, compute_ns=rank)
    files.write_record(old, 0)
    launcher = rank_pod_object(new_uid(), "s1")
    launcher["metadata"]["name"] = "rankpack-s1-launcher"
    del launcher["metadata"]["labels"]["rankpack.dev/rank"]
    pods = [group_pod_object(group, "s1"), rank_pod_object(old, "s0"), launcher]
    reader = NodeReader(files.kubelet_root, files.cgroup_root, files.pods_cgroup, proc.root)
    agent = NodeAgent("node-1", reader, RankPods(lambda: [dict(p) for p in pods]),
                      Authorizer(ApiReviewer(FakeKubeApi())))  # fmt: skip
    server = AgentServer(("127.0.0.1", 0), agent)
    server.start()
    before = os.getpriority(os.PRIO_PROCESS, me)
    yield GroupNode(pods, agent, server, me)
    set_nice(me, before)
    server.shutdown()
    server.server_close()


def test_ranks_has_an_entry_per_rank_of_a_group_pod(node: GroupNode) -> None:
    status, data = node.request("GET", "/v1/ranks?namespace=runs")
    assert status == 200
    got = [(r["pod"], r["sim"], r["rank"]) for r in data["ranks"]]
    assert got == [("rankpack-s0-0", "s0", 0)] + [("rankpack-s1-g0", "s1", r) for r in range(4)]
    by_rank = {r["rank"]: r for r in data["ranks"] if r["sim"] == "s1"}
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    assert by_rank[0]["usage_ns"] == 100 * tick_ns and by_rank[0]["nr_throttled"] == 3
    assert by_rank[2]["usage_ns"] is None  # not started: no pid file
    assert by_rank[3]["shim"]["compute_ns"] == 3
    assert data["ranks"][0]["usage_ns"] == 10**9  # the old rank pod: its cgroup


def test_nices_sets_the_ranks_of_a_group_pod(node: GroupNode) -> None:
    status, data = node.put_nices("rankpack-s1-g0", {"nices": {"1": 9}})
    assert status == 200 and data == {"node": "node-1", "pod": "rankpack-s1-g0", "ranks": [1]}
    assert os.getpriority(os.PRIO_PROCESS, node.me) == 9
    # rank 0's process is in the fake /proc only: it ended, as far as the kernel knows
    assert node.put_nices("rankpack-s1-g0", {"nices": {"0": 0}})[0] == 409
    text = node.agent.metrics.text().decode()
    assert 'rankpack_node_agent_requests_total{code="200",route="nices"} 1.0' in text


@pytest.mark.parametrize(
    ("pod", "body", "token", "status"),
    [
        ("rankpack-s1-g0", {"nices": {"1": 9}}, None, 401),
        ("rankpack-s1-g0", {"nices": {"1": 9}}, CREATOR, 403),
        ("rankpack-s1-g9", {"nices": {"1": 9}}, OPERATOR, 404),  # no such pod here
        ("rankpack-s1-launcher", {"nices": {"0": 9}}, OPERATOR, 404),  # not a rank pod
        ("Rankpack!", {"nices": {"1": 9}}, OPERATOR, 404),
        ("rankpack-s1-g0", {"nices": {"9": 9}}, OPERATOR, 409),  # not one of its ranks
        ("rankpack-s1-g0", {"nices": {"1": 9, "2": 9}}, OPERATOR, 409),  # rank 2 not started
        ("rankpack-s1-g0", {"nices": {"1": 20}}, OPERATOR, 400),
        ("rankpack-s1-g0", b"nope", OPERATOR, 400),
    ],
)  # fmt: skip
def test_nices_refusals_change_nothing(
    node: GroupNode, pod: str, body: Obj | bytes, token: str | None, status: int
) -> None:
    before = os.getpriority(os.PRIO_PROCESS, node.me)
    assert node.put_nices(pod, body, token=token)[0] == status
    assert os.getpriority(os.PRIO_PROCESS, node.me) == before
    assert node.request("GET", "/v1/namespaces/runs/pods/rankpack-s1-g0/nices")[0] == 405


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b"{}", b'{"nices": []}', b'{"nices": {}}', b'{"nices": {"x": 1}}',
     b'{"nices": {"01": 1}}', b'{"nices": {"-1": 1}}', b'{"nices": {"0": -1}}',
     b'{"nices": {"0": 20}}', b'{"nices": {"0": true}}', b'{"nices": {"0": 1.0}}',
     b'{"nices": {"0": "1"}}', b'{"nices": {"1234567": 1}}'],
)  # fmt: skip
def test_a_nices_body_that_is_not_one_is_refused(body: bytes) -> None:
    assert parse_nices(body) is None


def test_a_nices_body_for_every_rank_fits() -> None:
    body = json.dumps({"nices": {str(r): 19 for r in range(MAX_RANKS)}}).encode()
    assert parse_nices(body) == dict.fromkeys(range(MAX_RANKS), 19)
    from rankpack.nodeagent.service import MAX_BODY

    assert len(body) <= MAX_BODY
    too_many = json.dumps({"nices": {str(r): 0 for r in range(MAX_RANKS + 1)}}).encode()
    assert parse_nices(too_many) is None


# -- the backend's client -------------------------------------------------------------------


def client(node: GroupNode) -> AgentReadings:
    agent = {
        "metadata": {"name": "agent-1", "namespace": "rankpack", "creationTimestamp": "1",
                     "labels": {"app.kubernetes.io/name": "rankpack-node-agent"}},
        "spec": {"nodeName": "node-1"},
        "status": {"phase": "Running", "podIP": "127.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    api = FakeKubeApi(namespace="runs", token=OPERATOR, other_pods=[agent])
    return AgentReadings(api, agent_namespace="rankpack", port=node.server.port,
                         clock=FakeClock(1000.0))  # fmt: skip


def test_the_client_reads_each_rank_of_a_group_pod(node: GroupNode) -> None:
    readings = client(node)
    group, old = node.pods[0], node.pods[1]
    got = [readings.read(group, r) for r in range(4)]
    assert [r is not None and r.cpu is not None for r in got] == [True, True, False, False]
    assert [r.shim.compute_ns for r in got if r and r.shim] == [0, 1, 2, 3]
    assert readings.read(group, 4) is None and readings.read(group) is None
    old_reading = readings.read(old)
    assert old_reading is not None and old_reading.cpu is not None
    assert old_reading.cpu.usage_ns == 10**9


def test_the_client_sets_nices_and_wait_modes_of_a_group_pod(node: GroupNode) -> None:
    readings = client(node)
    group = node.pods[0]
    readings.set_nices("s1", group, {1: 11})
    assert os.getpriority(os.PRIO_PROCESS, node.me) == 11
    with pytest.raises(BackendError, match="409"):
        readings.set_nices("s1", group, {1: 2, 3: 2})  # rank 3 has not started
    assert os.getpriority(os.PRIO_PROCESS, node.me) == 11
    with pytest.raises(BackendError, match="not on a node"):
        readings.set_nices("s1", {**group, "spec": {}}, {1: 2})
    readings.set_wait_mode("s1", [group], "polite")
    assert node.request("PUT", "/v1/namespaces/runs/simulations/s1/wait-mode",
                        b'{"mode": "polite"}')[1]["ranks"] == [0, 1, 2, 3]  # fmt: skip
