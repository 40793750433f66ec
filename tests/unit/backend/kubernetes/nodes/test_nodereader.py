"""The node reader against fakes of a node's filesystems: cgroup counters (v1, v2, PSI), the
shim's records in each pod's own volume, their wait-mode word, and what an untrusted pod
directory may not make it do (follow a link out, block, read a path built from a bad uid)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rankpack.backend.kubernetes.nodes.nodereader import (
    CpuCounters,
    NodeCgroups,
    NodeRankReading,
    NodeReader,
    NotPublished,
    Pressure,
    check_pods_cgroup,
    parse_pressure,
    rank_pods,
)
from rankpack.backend.kubernetes.nodes.rankwire import reading_from_json, reading_json
from rankpack.backend.mpirun import ShimSample
from rankpack.errors import UserError
from rankpack.profile.records import read_record
from tests.unit.backend.kubernetes.fakenode import (
    FakeNodeFilesystems,
    new_uid,
    rank_pod_object,
    record_bytes,
)

PSI = ("some avg10=12.50 avg60=3.00 avg300=1.00 total=4000000\n"
       "full avg10=2.00 avg60=0.50 avg300=0.10 total=900000\n")  # fmt: skip


def reader_of(node: FakeNodeFilesystems) -> NodeReader:
    return NodeReader(node.kubelet_root, node.cgroup_root, node.pods_cgroup)


# -- cgroups --------------------------------------------------------------------------------


@pytest.mark.parametrize("qos", ["Burstable", "Guaranteed", "BestEffort"])
def test_cgroup_v1_counters_by_qos(tmp_path: Path, qos: str) -> None:
    node = FakeNodeFilesystems(tmp_path, v2=False)
    uid = new_uid()
    node.add_cgroup(uid, qos, usage_ns=123456789, nr_throttled=2, throttled_ns=99)
    reader = reader_of(node)
    assert reader.available
    reading = reader.read(rank_pod_object(uid, qos=qos))
    assert reading == NodeRankReading(CpuCounters(123456789, 2, 99), None, None)
    # a pod whose qosClass the API did not give yet is found in any QoS directory
    assert reader.read(rank_pod_object(uid, qos="")).cpu == CpuCounters(123456789, 2, 99)


def test_cgroup_v2_counters_and_pressure(tmp_path: Path) -> None:
    node = FakeNodeFilesystems(tmp_path)
    uid, bare = new_uid(), new_uid()
    node.add_cgroup(uid, usage_ns=5_000_000, nr_throttled=1, throttled_ns=7000, pressure=PSI)
    node.add_cgroup(bare, "Guaranteed", usage_ns=1000)  # a kernel without PSI
    reader = reader_of(node)
    reading = reader.read(rank_pod_object(uid))
    assert reading.cpu == CpuCounters(5_000_000, 1, 7000)
    assert reading.psi == Pressure(12.5, 4_000_000, 2.0, 900_000)
    assert reader.read(rank_pod_object(bare, qos="Guaranteed")).psi is None
    assert reader.read(rank_pod_object(new_uid())).cpu is None  # no cgroup (yet): no counters


def test_the_pods_cgroup_is_configurable_for_several_nodes_on_one_machine(tmp_path: Path) -> None:
    node = FakeNodeFilesystems(tmp_path, pods_cgroup="node-b/kubepods")
    uid = new_uid()
    node.add_cgroup(uid, usage_ns=3000)
    assert reader_of(node).read(rank_pod_object(uid)).cpu == CpuCounters(3000)
    assert not NodeReader(node.kubelet_root, node.cgroup_root).available  # not kubepods here


@pytest.mark.parametrize("bad", ["", "/", "../kubepods", "kubepods/../../x", "."])
def test_a_pods_cgroup_outside_the_root_is_refused(bad: str) -> None:
    with pytest.raises(UserError):
        check_pods_cgroup(bad)
    assert check_pods_cgroup("/node-b/kubepods/") == "node-b/kubepods"


def test_nothing_is_available_without_the_nodes_directories(tmp_path: Path) -> None:
    assert not NodeReader(tmp_path / "k", tmp_path / "c").available
    assert not NodeCgroups(tmp_path).available


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (PSI, Pressure(12.5, 4_000_000, 2.0, 900_000)),
        ("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n", Pressure(0.0, 7)),
        ("", None),
        ("some avg10=x total=1\n", None),
    ],
    ids=["some-and-full", "some-only", "empty", "garbage"],
)
def test_parse_pressure(text: str, want: Pressure | None) -> None:
    assert parse_pressure(text) == want


# -- the shim's records -----------------------------------------------------------------------


def test_the_shims_record_in_the_pods_own_volume(tmp_path: Path) -> None:
    node = FakeNodeFilesystems(tmp_path)
    uid = new_uid()
    node.add_cgroup(uid, usage_ns=10**9)
    node.write_record(uid, 3, compute_ns=600, mpi_ns=400, window=(3, 1), wait_mode="polite")
    reading = reader_of(node).read(rank_pod_object(uid, rank=3))
    assert reading.shim == ShimSample(600, 400, 0.75, "polite")
    assert reader_of(node).read(rank_pod_object(uid, rank=2)).shim is None  # another rank's


@pytest.mark.parametrize(
    "data",
    [b"", bytes(2168), record_bytes(0, seq=0), record_bytes(0, magic=0xDEAD), b"\x02" + bytes(20)],
    ids=["empty", "zeros", "never-published", "not-a-record", "short"],
)
def test_records_that_are_not_published_read_as_none(tmp_path: Path, data: bytes) -> None:
    node = FakeNodeFilesystems(tmp_path)
    uid = new_uid()
    node.write_record(uid, 0, data)
    assert reader_of(node).read(rank_pod_object(uid)).shim is None


def test_a_torn_record_is_given_up_at_once(tmp_path: Path) -> None:
    node = FakeNodeFilesystems(tmp_path)
    uid = new_uid()
    node.write_record(uid, 0, record_bytes(0, seq=3))  # a writer stuck mid-update
    t0 = time.monotonic()
    assert reader_of(node).read(rank_pod_object(uid)).shim is None
    assert time.monotonic() - t0 < 1.0


def test_a_link_out_of_the_pods_directory_is_never_followed(tmp_path: Path) -> None:
    node = FakeNodeFilesystems(tmp_path)
    elsewhere = tmp_path / "host" / "rank-0.rec"  # a valid record outside the pod's volume
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(record_bytes(0, compute_ns=1))
    linked_file, linked_dir = new_uid(), new_uid()
    node.live_dir(linked_file).mkdir(parents=True)
    (node.live_dir(linked_file) / "rank-0.rec").symlink_to(elsewhere)
    node.live_dir(linked_dir).parent.mkdir(parents=True)
    node.live_dir(linked_dir).symlink_to(elsewhere.parent)  # the volume's directory itself
    reader = reader_of(node)
    for uid in (linked_file, linked_dir):
        assert reader.read(rank_pod_object(uid)).shim is None
        with pytest.raises(NotPublished):
            reader.set_wait_modes([rank_pod_object(uid)], "polite")
    assert read_record(elsewhere).wait_mode_requested == "spin"  # type: ignore[union-attr]


def test_a_fifo_in_place_of_a_record_does_not_block(tmp_path: Path) -> None:
    node = FakeNodeFilesystems(tmp_path)
    uid = new_uid()
    node.live_dir(uid).mkdir(parents=True)
    os.mkfifo(node.live_dir(uid) / "rank-0.rec")
    assert reader_of(node).read(rank_pod_object(uid)).shim is None
    with pytest.raises(NotPublished):
        reader_of(node).set_wait_modes([rank_pod_object(uid)], "polite")


@pytest.mark.parametrize(
    ("uid", "rank"),
    [("../../../etc", "0"), ("0" * 36, "0"), (None, "0"), ("UID", "0"), ("ok", "1/../2"),
     ("ok", "x"), ("ok", "-1"), ("ok", None), ("ok", "1234567")],
)  # fmt: skip
def test_pods_without_a_uuid_or_a_numeric_rank_are_refused(uid: str | None, rank: str) -> None:
    pod = rank_pod_object(new_uid() if uid == "ok" else "x")
    pod["metadata"]["uid"] = new_uid() if uid == "ok" else uid
    pod["metadata"]["labels"]["rankpack.dev/rank"] = rank
    with pytest.raises(ValueError):
        rank_pods(pod)


# -- the wait-mode word -----------------------------------------------------------------------


def test_wait_modes_are_written_into_every_ranks_control_word(tmp_path: Path) -> None:
    node = FakeNodeFilesystems(tmp_path)
    uids = [new_uid() for _ in range(2)]
    paths = [node.write_record(u, r) for r, u in enumerate(uids)]
    pods = [rank_pod_object(u, rank=r) for r, u in enumerate(uids)]
    assert reader_of(node).set_wait_modes(pods, "polite") == [0, 1]
    for path in paths:
        rec = read_record(path)
        assert rec is not None and rec.wait_mode_requested == "polite"
        assert rec.compute_ns == 0 and rec.seq == 2  # nothing else was touched


def test_no_rank_changes_while_one_has_not_published(tmp_path: Path) -> None:
    node = FakeNodeFilesystems(tmp_path)
    published, late = new_uid(), new_uid()
    path = node.write_record(published, 0)
    node.write_record(late, 1, record_bytes(1, seq=0))
    pods = [rank_pod_object(published, rank=0), rank_pod_object(late, rank=1)]
    with pytest.raises(NotPublished, match="rank 1"):
        reader_of(node).set_wait_modes(pods, "adaptive")
    with pytest.raises(NotPublished, match="rank 2"):
        reader_of(node).set_wait_modes([*pods[:1], rank_pod_object(new_uid(), rank=2)], "spin")
    assert read_record(path).wait_mode_requested == "spin"  # type: ignore[union-attr]
    with pytest.raises(UserError, match="unknown wait mode"):
        reader_of(node).set_wait_modes(pods[:1], "nap")


# -- the wire form ----------------------------------------------------------------------------


def test_a_reading_survives_the_wire(tmp_path: Path) -> None:
    (who,) = rank_pods(rank_pod_object(new_uid(), rank=2))
    for reading in (
        NodeRankReading(CpuCounters(5, 1, 2), Pressure(1.5, 10, None, None),
                    ShimSample(1, 2, 0.25, "spin")),
        NodeRankReading(None, None, None),
        NodeRankReading(CpuCounters(0), None, ShimSample(3, 4, None, "polite")),
    ):  # fmt: skip
        entry = reading_json(who, reading)
        assert (entry["rank"], entry["sim"], entry["uid"]) == (2, "s1", who.uid)
        assert reading_from_json(entry) == reading


@pytest.mark.parametrize(
    "entry",
    [[], {"usage_ns": -1}, {"usage_ns": "5"}, {"usage_ns": True}, {"psi": {"some_avg10": "x"}},
     {"shim": {"compute_ns": 1.5}}],
)  # fmt: skip
def test_an_entry_that_is_not_a_reading_is_refused(entry: object) -> None:
    with pytest.raises(ValueError):
        reading_from_json(entry)  # type: ignore[arg-type]
