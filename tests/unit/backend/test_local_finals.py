"""The local backend and the ranks' final records: where it asks the shim to write them,
and that an ended run's observation carries them, read once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankpack.backend.local import launching
from rankpack.backend.local.observing import LocalRun
from rankpack.backend.mpirun import LogTail, ShimRecords, final_dir
from rankpack.backend.protocol import RankResources, ShimSpec, SimPhase, SimSpec


def _spec(case: Path) -> SimSpec:
    ranks = (RankResources(1000), RankResources(1000))
    return SimSpec("s1", case, ("solver",), ranks, case / "log", shim=ShimSpec())


def _write_final(case: Path, rank: int, compute_ns: int, mpi_ns: int) -> None:
    record = {
        "version": 1, "rank": rank, "world_size": 2, "pid": 9, "host": "h",
        "compute_ns": compute_ns, "mpi_ns": mpi_ns, "cpu_ns": 5 * 10**9,
        "wall_ns": compute_ns + mpi_ns, "finalized": 1, "wait_mode": 0, "wait_switches": 0,
        "sleeps": 0,
    }  # fmt: skip
    (final_dir(case) / f"rank-{rank}.final.json").write_text(json.dumps(record))


def test_the_ranks_are_told_to_write_their_final_records_in_the_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "librankpack_pmpi.openmpi.so"
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setattr("rankpack.profile.shim.shim_library", lambda flavour: lib)
    spec = _spec(tmp_path)
    final_dir(tmp_path).mkdir(parents=True)
    _write_final(tmp_path, 0, 1, 1)  # an earlier run's, in the same directory
    env = launching.environment(spec, launching.prepare_dirs(spec))
    assert env["RANKPACK_SHIM_FINAL_DIR"] == str(tmp_path / ".rankpack" / "final")
    assert not any(final_dir(tmp_path).iterdir())  # the earlier run's record is gone
    argv = launching.command(spec, "mpirun", env)
    assert argv[argv.index("RANKPACK_SHIM_FINAL_DIR") - 1] == "-x"  # forwarded to the ranks


def test_an_ended_run_observes_its_ranks_final_records_once(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    final_dir(tmp_path).mkdir(parents=True)
    run = LocalRun(
        sim_id="s1", spec=spec, cgroups=None, pid_dir=tmp_path / "pids",
        desired=list(spec.ranks), log=LogTail(spec.log_path), shim=ShimRecords(spec),
    )  # fmt: skip
    _write_final(tmp_path, 0, 3 * 10**9, 10**9)
    assert all(r.final is None for r in run.observe(1.0).ranks)  # running: not read
    run.ended = True
    obs = run.observe(2.0)
    assert obs.phase is SimPhase.SUCCEEDED
    first = obs.ranks[0].final
    assert first is not None and first.duty == 0.75 and first.cpu_s == 5.0
    assert obs.ranks[1].final is None  # rank 1 wrote none
    _write_final(tmp_path, 1, 1, 1)
    assert [r.final for r in run.observe(3.0).ranks] == [first, None]  # read once
