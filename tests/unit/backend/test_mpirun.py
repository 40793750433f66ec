"""The mpirun helpers both real backends share, without starting a process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankpack.backend.mpirun import (
    LogTail,
    ShimRecords,
    ShimSample,
    final_dir,
    find_mpirun,
    prepare_final_dir,
    read_final_records,
    shim_dir,
)
from rankpack.backend.protocol import BackendError, RankResources, ShimSpec, SimSpec
from rankpack.errors import UserError


def _mpirun_spec(tmp_path: Path, shim: ShimSpec | None) -> SimSpec:
    ranks = (RankResources(1000), RankResources(1000))
    return SimSpec("s1", tmp_path, ("solver",), ranks, tmp_path / "log", shim=shim)


def test_log_tail_delivers_whole_lines_until_the_end(tmp_path: Path) -> None:
    log = tmp_path / "log"
    tail = LogTail(log)
    assert tail.read(ended=False) == ""  # no log yet
    log.write_bytes(b"one\ntw")
    assert tail.read(ended=False) == "one\n"
    assert tail.read(ended=False) == ""
    with log.open("ab") as fh:
        fh.write(b"o\nthr")
    assert tail.read(ended=False) == "two\n"
    assert tail.read(ended=True) == "thr"
    assert tail.offset == len(b"one\ntwo\nthr")


def test_find_mpirun_honours_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANKPACK_MPIRUN", "/opt/mpi/bin/mpirun")
    assert find_mpirun("mpich") == "/opt/mpi/bin/mpirun"


def test_find_mpirun_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANKPACK_MPIRUN", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UserError, match="RANKPACK_MPIRUN"):
        find_mpirun("openmpi")


def test_shim_records_without_the_shim_refuse_a_wait_mode(tmp_path: Path) -> None:
    records = ShimRecords.of(_mpirun_spec(tmp_path, None))
    assert records.readers == [] and records.sample(0) == ShimSample()
    with pytest.raises(BackendError, match="without the shim"):
        records.set_wait_mode("polite")


def test_shim_records_before_any_record_sample_empty(tmp_path: Path) -> None:
    records = ShimRecords.of(_mpirun_spec(tmp_path, ShimSpec()))
    assert [r.path.parent for r in records.readers] == [shim_dir(tmp_path)] * 2
    assert records.sample(1) == ShimSample()
    with pytest.raises(BackendError):
        records.set_wait_mode("polite")  # no rank has published its record yet
    records.close()


def test_final_records_are_read_from_the_run_directory_and_an_earlier_runs_are_cleared(
    tmp_path: Path,
) -> None:
    spec = _mpirun_spec(tmp_path, ShimSpec())
    assert read_final_records(spec) == {}  # no directory yet
    directory = final_dir(tmp_path)
    directory.mkdir(parents=True)
    record = {
        "version": 1, "rank": 1, "world_size": 2, "pid": 7, "host": "h", "compute_ns": 1,
        "mpi_ns": 3, "cpu_ns": 4, "wall_ns": 4, "finalized": 0, "wait_mode": 2,
        "wait_switches": 1, "sleeps": 0,
    }  # fmt: skip
    (directory / "rank-1.final.json").write_text(json.dumps(record))
    (finals,) = read_final_records(spec).values()
    assert (finals.rank, finals.duty, finals.wait_mode) == (1, 0.25, "adaptive")
    assert read_final_records(_mpirun_spec(tmp_path, None)) == {}  # no shim: none asked for
    (directory / "rank-5.final.json").write_text("{}")  # beyond this run's ranks: left
    assert prepare_final_dir(tmp_path, 2) == directory
    assert sorted(p.name for p in directory.iterdir()) == ["rank-5.final.json"]
