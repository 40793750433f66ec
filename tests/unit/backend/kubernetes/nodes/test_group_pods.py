"""The node reader and group pods (decision 0012): one `RankPod` per rank of a group pod, a
rank's CPU time from its own process, found from the pid its pod gives among the processes
of that pod's cgroup only (fake ``/proc`` and cgroup trees; a pid file is untrusted), and
nice values set on a real process (the test's own, through the real ``/proc`` too)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankpack.backend.kubernetes.nodes.nodereader import (
    MAX_PID_FILE,
    CpuCounters,
    NodeReader,
    NotPublished,
    holds_ranks,
    one_rank,
    pid_file_name,
    rank_pods,
)
from rankpack.backend.kubernetes.nodes.rankprocs import parse_ns_pid, parse_proc_stat
from rankpack.backend.ranknice import set_nice
from rankpack.errors import UserError
from rankpack.profile.records import read_record
from tests.unit.backend.kubernetes.fakenode import (
    FakeNodeFilesystems,
    FakeProc,
    group_pod_object,
    new_uid,
    rank_pod_object,
)

TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def reader_of(node: FakeNodeFilesystems, proc: Path) -> NodeReader:
    return NodeReader(node.kubelet_root, node.cgroup_root, node.pods_cgroup, proc)


@pytest.fixture
def this_process() -> Iterator[int]:
    """This test's own process as a rank's (a unit test starts no process): its nice value,
    every thread's, is given back afterwards (root may lower it again)."""
    before = os.getpriority(os.PRIO_PROCESS, os.getpid())
    yield os.getpid()
    set_nice(os.getpid(), before)


# -- which ranks a pod holds ----------------------------------------------------------------


def test_a_group_pod_holds_the_ranks_of_its_annotation() -> None:
    uid = new_uid()
    ranks = rank_pods(group_pod_object(uid, ranks="4-7", group=1))
    assert [w.rank for w in ranks] == [4, 5, 6, 7]
    assert {(w.name, w.uid, w.sim, w.group) for w in ranks} == {("rankpack-s1-g1", uid, "s1", True)}
    (one,) = rank_pods(rank_pod_object(uid, rank=3))
    assert (one.rank, one.group) == (3, False)
    assert one_rank(group_pod_object(uid), 2).rank == 2
    assert one_rank(rank_pod_object(uid, rank=3), None).rank == 3
    with pytest.raises(ValueError):
        one_rank(group_pod_object(uid, ranks="0-3"), 4)  # not one of its ranks
    with pytest.raises(ValueError):
        one_rank(group_pod_object(uid), None)  # a group pod's reading names its rank
    launcher = rank_pod_object(uid)
    del launcher["metadata"]["labels"]["rankpack.dev/rank"]
    assert holds_ranks(group_pod_object(uid)) and not holds_ranks(launcher)


@pytest.mark.parametrize("text", [None, "", "0-", "3-1", "2-2", "01", "a", "0-4096", "0,2", " 1"])
def test_a_group_pod_whose_annotation_is_not_a_run_is_refused(text: str | None) -> None:
    pod = group_pod_object(new_uid())
    if text is None:
        del pod["metadata"]["annotations"]
    else:
        pod["metadata"]["annotations"]["rankpack.dev/ranks"] = text
    with pytest.raises(ValueError):
        rank_pods(pod)


def test_a_pod_with_both_labels_or_neither_is_refused() -> None:
    both = group_pod_object(new_uid())
    both["metadata"]["labels"]["rankpack.dev/rank"] = "0"
    neither = rank_pod_object(new_uid())
    del neither["metadata"]["labels"]["rankpack.dev/rank"]
    bad_uid = group_pod_object("../../etc")
    for pod in (both, neither, bad_uid):
        with pytest.raises(ValueError):
            rank_pods(pod)


# -- a rank's process -----------------------------------------------------------------------


def group_node(tmp_path: Path, *, v2: bool = True) -> tuple[FakeNodeFilesystems, FakeProc, str]:
    """A group pod of ranks 0-3 whose ranks 0 and 1 run (pod pids 7 and 8; host 1007, 1008)
    beside the pod's own processes (the pause container's pid 1, the daemon's)."""
    node = FakeNodeFilesystems(tmp_path, v2=v2)
    proc = FakeProc(tmp_path / "proc")
    uid = new_uid()
    node.add_cgroup(uid, usage_ns=9 * 10**9, nr_throttled=4, throttled_ns=5000)
    node.add_procs(uid, [1001], container="pause")
    node.add_procs(uid, [1002, 1007, 1008])
    proc.add(1001, (1,))
    proc.add(1002, (1,), starttime=50)
    proc.add(1007, (7,), starttime=100, utime=30, stime=12)
    proc.add(1008, (8,), starttime=101, utime=5, stime=0)
    node.write_pid(uid, 0, "7\n")
    node.write_pid(uid, 1, "8")
    return node, proc, uid


@pytest.mark.parametrize("v2", [True, False], ids=["v2", "v1"])
def test_a_ranks_cpu_is_its_processes_and_the_throttling_its_pods(tmp_path: Path, v2: bool) -> None:
    node, proc, uid = group_node(tmp_path, v2=v2)
    reader = reader_of(node, proc.root)
    pod = group_pod_object(uid)
    assert reader.read(pod, 0).cpu == CpuCounters(42 * TICK_NS, 4, 5000)
    assert reader.read(pod, 1).cpu == CpuCounters(5 * TICK_NS, 4, 5000)
    assert reader.read(pod, 2).cpu is None  # no pid file: not started
    every = reader.readings_of(pod)
    assert [(w.rank, r.cpu is not None) for w, r in every] == [
        (0, True), (1, True), (2, False), (3, False)
    ]  # fmt: skip
    with pytest.raises(ValueError):
        reader.read(pod, 4)
    # an old one-rank pod still reads its pod's cgroup
    other = new_uid()
    node.add_cgroup(other, usage_ns=3000)
    assert reader.read(rank_pod_object(other)).cpu == CpuCounters(3000)


def test_a_forged_pid_cannot_name_a_process_outside_the_pods_cgroup(tmp_path: Path) -> None:
    node, proc, uid = group_node(tmp_path)
    proc.add(2000, (9,))  # another pod's rank with pid 9 in its pod
    proc.add(9, ())  # a host process with pid 9
    proc.add(3000, (7,))  # another pod's process with the same pod pid as rank 0
    node.write_pid(uid, 2, "9\n")
    node.write_pid(uid, 3, "1\n")  # the pause container's and the daemon's pid 1: ambiguous
    reader = reader_of(node, proc.root)
    pod = group_pod_object(uid)
    assert reader.read(pod, 2).cpu is None
    assert reader.read(pod, 3).cpu is None
    assert reader.read(pod, 0).cpu == CpuCounters(42 * TICK_NS, 4, 5000)  # 1007, not 3000


def test_pid_files_that_are_not_a_pid_are_refused_without_blocking(tmp_path: Path) -> None:
    node, proc, uid = group_node(tmp_path)
    elsewhere = tmp_path / "elsewhere.pid"
    elsewhere.write_text("7\n")
    live = node.live_dir(uid)
    for rank in (0, 1):
        (live / pid_file_name(rank)).unlink()
    (live / pid_file_name(0)).symlink_to(elsewhere)
    os.mkfifo(live / pid_file_name(1))
    node.write_pid(uid, 2, "0" * MAX_PID_FILE + "7\n")
    node.write_pid(uid, 3, "7x\n")
    reader = reader_of(node, proc.root)
    pod = group_pod_object(uid)
    t0 = time.monotonic()
    assert [r.cpu for _, r in reader.readings_of(pod)] == [None, None, None, None]
    assert time.monotonic() - t0 < 1.0
    for bad in ("", "\n", "-7\n", "7\n\n", "99999999\n", " 7"):
        node.write_pid(uid, 3, bad)
        assert reader.read(pod, 3).cpu is None, bad


def test_a_restarted_process_is_found_again(tmp_path: Path) -> None:
    node, proc, uid = group_node(tmp_path)
    reader = reader_of(node, proc.root)
    pod = group_pod_object(uid)
    assert reader.read(pod, 0).cpu is not None
    # known: checked by its start time, the cgroup is not scanned again
    node.add_procs(uid, [])
    assert reader.read(pod, 0).cpu == CpuCounters(42 * TICK_NS, 4, 5000)
    # the rank restarted: the same pod pid, a new host process (another start time)
    proc.remove(1007)
    proc.add(1099, (7,), starttime=500, utime=1)
    node.add_procs(uid, [1002, 1099, 1008])
    assert reader.read(pod, 0).cpu == CpuCounters(TICK_NS, 4, 5000)
    # the same host pid reused by another process of the pod: its start time tells
    proc.add(1099, (7,), starttime=600, utime=2)
    assert reader.read(pod, 0).cpu == CpuCounters(2 * TICK_NS, 4, 5000)
    proc.remove(1099)
    assert reader.read(pod, 0).cpu is None  # ended


def test_proc_files_are_parsed_as_the_kernel_writes_them() -> None:
    stat = b"42 (a) b (c)) R 1 1 1 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 555 0 0\n"
    got = parse_proc_stat(stat)
    assert got is not None and (got.cpu_ticks, got.starttime) == (10, 555)
    assert parse_proc_stat(b"42 (a) R 1") is None
    assert parse_ns_pid(b"Name:\tx\nNSpid:\t1007\t12\t7\n") == 7
    assert parse_ns_pid(b"Name:\tx\nNSpid:\t1007\n") == 1007
    assert parse_ns_pid(b"Name:\tx\n") is None


# -- wait modes and nice values -------------------------------------------------------------


def test_wait_modes_reach_every_rank_of_a_group_pod(tmp_path: Path) -> None:
    node = FakeNodeFilesystems(tmp_path)
    uid = new_uid()
    paths = [node.write_record(uid, r) for r in range(4)]
    reader = NodeReader(node.kubelet_root, node.cgroup_root, node.pods_cgroup)
    assert reader.set_wait_modes([group_pod_object(uid)], "polite") == [0, 1, 2, 3]
    assert {read_record(p).wait_mode_requested for p in paths} == {"polite"}  # type: ignore[union-attr]


def test_nice_values_are_set_on_the_ranks_process(tmp_path: Path, this_process: int) -> None:
    node, proc, uid = group_node(tmp_path)
    proc.add(this_process, (9,), starttime=700)  # rank 2 is this process, pid 9 in its pod
    node.add_procs(uid, [1002, 1007, 1008, this_process])
    node.write_pid(uid, 2, "9\n")
    reader = reader_of(node, proc.root)
    pod = group_pod_object(uid)
    assert reader.set_nices(pod, {2: 12}) == [2]
    assert os.getpriority(os.PRIO_PROCESS, this_process) == 12
    assert reader.set_nices(pod, {2: 3}) == [2]  # lowered: this test runs as root
    assert os.getpriority(os.PRIO_PROCESS, this_process) == 3
    with pytest.raises(NotPublished, match="rank 3"):
        reader.set_nices(pod, {2: 15, 3: 15})  # rank 3 has not started: nothing changes
    assert os.getpriority(os.PRIO_PROCESS, this_process) == 3
    for bad in ({4: 1}, {2: 20}, {2: -1}, {2: True}):
        with pytest.raises(UserError):
            reader.set_nices(pod, bad)  # type: ignore[arg-type]


def test_nice_values_through_the_real_proc(tmp_path: Path, this_process: int) -> None:
    """This machine's own /proc: a process's pid as this test's pid namespace sees it is
    the last field of its NSpid line."""
    node = FakeNodeFilesystems(tmp_path)
    uid = new_uid()
    node.add_cgroup(uid, usage_ns=10**9)
    gone = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids are below pid_max
    node.add_procs(uid, [gone, this_process])
    node.write_pid(uid, 5, f"{this_process}\n")
    node.write_pid(uid, 4, f"{os.getppid()}\n")  # a real process, not in the pod's cgroup
    reader = NodeReader(node.kubelet_root, node.cgroup_root, node.pods_cgroup)
    pod = group_pod_object(uid, ranks="4-5")
    got = reader.read(pod, 5).cpu
    assert got is not None and got.usage_ns > 0
    assert reader.read(pod, 4).cpu is None
    assert reader.set_nices(pod, {5: 7}) == [5]
    assert os.getpriority(os.PRIO_PROCESS, this_process) == 7
    with pytest.raises(NotPublished, match="rank 4"):
        reader.set_nices(pod, {4: 1, 5: 1})
    assert os.getpriority(os.PRIO_PROCESS, this_process) == 7
