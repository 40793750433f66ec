"""Kubelet CPU mapping, and the v1/v2 drivers against a cgroupfs laid out in a temporary
directory. The directory tree is a FAKE of the kernel's cgroup filesystem (a boundary we
cannot reach for v2 on this machine, whose v2 mount has no cpu controller); the real v1
driver is exercised by the integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankpack.backend import cgroups
from rankpack.backend.cgroups import (
    CgroupV1,
    CgroupV2,
    millis_to_quota_us,
    millis_to_shares,
    millis_to_weight,
    shares_to_weight,
)


@pytest.mark.parametrize(
    ("millis", "shares"),
    [(0, 2), (1, 2), (2, 2), (182, 186), (909, 930), (1000, 1024), (2727, 2792),
     (256_000, 262144), (500_000, 262144)],
)  # fmt: skip
def test_shares_like_kubelet(millis: int, shares: int) -> None:
    assert millis_to_shares(millis) == shares


@pytest.mark.parametrize(
    ("shares", "weight"), [(2, 1), (1024, 39), (262144, 10000), (186, 8), (2792, 107)]
)
def test_weight_from_shares_like_kubelet(shares: int, weight: int) -> None:
    assert shares_to_weight(shares) == weight


def test_weight_from_millis() -> None:
    assert millis_to_weight(1000) == 39
    assert millis_to_weight(0) == 1


@pytest.mark.parametrize(
    ("millis", "quota"),
    [(None, None), (0, None), (5, 1000), (91, 9100), (250, 25000), (2500, 250000)],
)
def test_quota_like_kubelet(millis: int | None, quota: int | None) -> None:
    assert millis_to_quota_us(millis) == quota


def _fake_v2(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("cpu memory\n")


def _fake_v2_child(d: Path) -> None:
    # What the kernel would create in a new v2 cgroup.
    (d / "cgroup.subtree_control").write_text("")
    (d / "cgroup.procs").write_text("")
    (d / "cpu.weight").write_text("100\n")
    (d / "cpu.max").write_text("max 100000\n")
    (d / "cpu.stat").write_text(
        "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n"
        "nr_periods 40\nnr_throttled 7\nthrottled_usec 250000\n"
    )


def test_detect_v2_and_v1(tmp_path: Path) -> None:
    _fake_v2(tmp_path / "v2")
    assert cgroups.detect(tmp_path / "v2").version == "v2"
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.shares").write_text("1024\n")
    (v1 / "cpuacct").mkdir()
    (v1 / "cpuacct" / "cpuacct.usage").write_text("0\n")
    driver = cgroups.detect(v1)
    assert isinstance(driver, CgroupV1)
    assert driver.cpuacct_root == v1 / "cpuacct"


def test_detect_without_cpu_controller_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="no cgroup cpu controller"):
        cgroups.detect(tmp_path)


def test_v2_driver_writes_weight_and_max(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _fake_v2(root)
    driver = CgroupV2(root)
    # create level by level, adding the files the kernel would put in each new cgroup
    for rel in ("rankpack", "rankpack/run-x", "rankpack/run-x/rank-0"):
        driver.create(rel)
        assert (root / rel).is_dir()
        _fake_v2_child(root / rel)
    driver.create("rankpack/run-x/rank-0")
    # the cpu controller is delegated down to the rank's parent
    assert (root / "rankpack" / "cgroup.subtree_control").read_text() == "+cpu"
    assert (root / "rankpack/run-x" / "cgroup.subtree_control").read_text() == "+cpu"
    settings = driver.set_cpu("rankpack/run-x/rank-0", 182, None)
    assert settings.weight == 8 and settings.quota_us is None
    assert (root / "rankpack/run-x/rank-0/cpu.weight").read_text() == "8"
    assert (root / "rankpack/run-x/rank-0/cpu.max").read_text() == "max 100000"
    driver.set_cpu("rankpack/run-x/rank-0", 250, 250)
    assert (root / "rankpack/run-x/rank-0/cpu.max").read_text() == "25000 100000"
    assert driver.read_settings("rankpack/run-x/rank-0").quota_us == 25000
    stat = driver.read_stat("rankpack/run-x/rank-0")
    assert stat.usage_ns == 1_500_000_000
    assert stat.nr_throttled == 7
    assert stat.throttled_ns == 250_000_000


def test_v1_driver_writes_shares_and_quota(tmp_path: Path) -> None:
    cpu, acct = tmp_path / "cpu", tmp_path / "cpuacct"
    cpu.mkdir()
    acct.mkdir()
    driver = CgroupV1(cpu, acct)
    driver.create("rankpack/run-y/rank-1")
    d = cpu / "rankpack/run-y/rank-1"
    assert (acct / "rankpack/run-y/rank-1").is_dir()
    driver.set_cpu("rankpack/run-y/rank-1", 909, None)
    assert (d / "cpu.shares").read_text() == "930"
    assert (d / "cpu.cfs_quota_us").read_text() == "-1"
    driver.set_cpu("rankpack/run-y/rank-1", 91, 91)
    assert (d / "cpu.cfs_quota_us").read_text() == "9100"
    assert (d / "cpu.cfs_period_us").read_text() == "100000"
    (d / "cpu.stat").write_text("nr_periods 10\nnr_throttled 3\nthrottled_time 42000000\n")
    (acct / "rankpack/run-y/rank-1/cpuacct.usage").write_text("123456789\n")
    stat = driver.read_stat("rankpack/run-y/rank-1")
    assert (stat.usage_ns, stat.nr_throttled, stat.throttled_ns) == (123456789, 3, 42000000)
    assert driver.join_dirs("rankpack/run-y") == [cpu / "rankpack/run-y", acct / "rankpack/run-y"]


def test_reap_stale_runs_only_touches_dead_owners(tmp_path: Path) -> None:
    cpu, acct = tmp_path / "cpu", tmp_path / "cpuacct"
    driver = CgroupV1(cpu, acct)
    import os

    dead_pid = 2**22 + 12345  # above pid_max on this kernel: never alive
    driver.create(f"rankpack/run-r1-{dead_pid}/rank-0")
    driver.create(f"rankpack/run-r2-{os.getpid()}/rank-0")
    driver.create("rankpack/not-ours")
    # a fake tree has no cgroup.procs files: no processes to kill
    reaped = cgroups.reap_stale_runs(driver)
    assert reaped == [f"run-r1-{dead_pid}"]
    assert not (cpu / f"rankpack/run-r1-{dead_pid}").exists()
    assert (cpu / f"rankpack/run-r2-{os.getpid()}").exists()
    assert (cpu / "rankpack/not-ours").exists()
