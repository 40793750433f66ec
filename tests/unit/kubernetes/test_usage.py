"""Per-rank CPU counters: the node's cgroup tree (v1, v2) and the container's own via exec."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from rankpack.backend.kubernetes.api import ExecResult
from rankpack.backend.kubernetes.usage import (
    CpuCounters,
    NodeCgroupUsage,
    PodExecUsage,
    parse_cpu_stat,
)

POD = {"metadata": {"name": "rankpack-s1-0", "uid": "abc"}}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("qos", ["burstable", "", "besteffort"], ids=["burstable", "guaranteed",
                                                                     "besteffort"])  # fmt: skip
def test_node_cgroup_v1(tmp_path: Path, qos: str) -> None:
    base = ("kubepods/" + (f"{qos}/" if qos else "")) + "podabc"
    write(tmp_path / "cpuacct" / base / "cpuacct.usage", "123456789\n")
    write(
        tmp_path / "cpu" / base / "cpu.stat", "nr_periods 10\nnr_throttled 2\nthrottled_time 99\n"
    )
    source = NodeCgroupUsage(tmp_path)
    assert source.available
    assert source.read(POD) == CpuCounters(123456789, 2, 99)
    assert source.read({"metadata": {"uid": "other"}}) is None


def test_node_cgroup_v2(tmp_path: Path) -> None:
    write(tmp_path / "cgroup.controllers", "cpu\n")
    write(tmp_path / "kubepods/burstable/podabc/cpu.stat",
          "usage_usec 5000\nnr_throttled 1\nthrottled_usec 7\n")  # fmt: skip
    assert NodeCgroupUsage(tmp_path).read(POD) == CpuCounters(5_000_000, 1, 7000)


def test_no_kubepods_means_not_available(tmp_path: Path) -> None:
    assert not NodeCgroupUsage(tmp_path).available


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("usage_usec 10\nuser_usec 5\nnr_throttled 3\nthrottled_usec 4\n",
         CpuCounters(10_000, 3, 4000)),
        ("usage_ns 77\nnr_periods 0\nnr_throttled 0\nthrottled_time 0\n", CpuCounters(77, 0, 0)),
        ("cat: no such file\n", None),
    ],
    ids=["v2", "v1", "nothing"],
)  # fmt: skip
def test_parse_cpu_stat(text: str, want: CpuCounters | None) -> None:
    assert parse_cpu_stat(text) == want


class FakeExec:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.usage = 100

    def exec(self, pod: str, container: str, argv: Sequence[str], timeout_s: float) -> ExecResult:
        self.calls.append(pod)
        self.usage += 100
        return ExecResult(0, f"usage_usec {self.usage}\n", "")


def test_pod_exec_usage_reuses_a_reading_for_its_interval() -> None:
    api = FakeExec()
    source = PodExecUsage(api, "rank", interval_s=60)
    first = source.read(POD)
    assert first == CpuCounters(200_000)
    assert source.read(POD) == first
    assert api.calls == ["rankpack-s1-0"]
    source.interval_s = 0
    assert source.read(POD) == CpuCounters(300_000)


def test_pods_below_a_node_cgroup_root_are_read_too(tmp_path: Path) -> None:
    """The dev cluster's nodes: <node root>/kubepods (a kubelet with its own cgroupRoot)."""
    write(tmp_path / "cpuacct/rankpack-node-1/kubepods/burstable/podabc/cpuacct.usage", "42\n")
    write(tmp_path / "cpu/rankpack-node-1/kubepods/burstable/podabc/cpu.stat",
          "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")  # fmt: skip
    source = NodeCgroupUsage(tmp_path)
    assert source.available
    counters = source.read(POD)
    assert counters is not None and counters.usage_ns == 42
