"""The ranks' final records on the Kubernetes backend: the shim writes them on the case
volume (not in the rank pods' own volumes), and a backend that adopts a run which ended
while nobody watched delivers them in its observation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankpack.backend.protocol import RankPhase, SimPhase
from tests.unit.backend.kubernetes.test_backend import SIM, Harness, _with_shim


def _final(rank: int, compute_ns: int, mpi_ns: int, cpu_ns: int) -> bytes:
    """Rank ``rank``'s final record of a 3-rank run, as the shim writes it."""
    return json.dumps({
        "version": 1, "rank": rank, "world_size": 3, "pid": 100 + rank, "host": "node-1",
        "compute_ns": compute_ns, "mpi_ns": mpi_ns, "cpu_ns": cpu_ns,
        "wall_ns": compute_ns + mpi_ns, "finalized": 1, "wait_mode": 0, "wait_switches": 0,
        "sleeps": 0,
    }).encode()  # fmt: skip


def test_an_adopted_run_that_ended_while_away_reports_its_ranks_final_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path)
    finals = h.case / ".rankpack" / "final"
    finals.mkdir(parents=True)
    (finals / "rank-0.final.json").write_bytes(_final(0, 1, 1, 1))  # an earlier run's
    spec = _with_shim(h, monkeypatch)
    h.backend.launch(spec)
    assert finals.is_dir() and not (finals / "rank-0.final.json").exists()  # not this run's
    h.run_all()
    (proc,) = h.procs
    assert f"-x RANKPACK_SHIM_FINAL_DIR={finals} " in " ".join(proc.argv)
    # the ranks end (ranks 0 and 1 wrote their records, rank 2 was killed), mpirun's exit
    # file is written, and the rank pods are gone, all while no rankpack process watched
    h.backend.forget_all()
    (finals / "rank-0.final.json").write_bytes(_final(0, 6 * 10**9, 2 * 10**9, 7 * 10**9))
    (finals / "rank-1.final.json").write_bytes(_final(1, 2 * 10**9, 6 * 10**9, 8 * 10**9))
    (h.case / ".rankpack" / "mpirun.exit").write_text("0\n")
    for name in h.group_pods():
        del h.api.objects[("pods", name)]
    later = h.make()
    later.adopt(SIM, spec)
    obs = later.observe(SIM)
    assert obs.phase is SimPhase.SUCCEEDED
    assert [r.phase for r in obs.ranks] == [RankPhase.SUCCEEDED] * 3
    assert [r.usage_ns for r in obs.ranks] == [0, 0, 0]  # nothing live was ever read
    first, second, third = (r.final for r in obs.ranks)
    assert first is not None and second is not None and third is None
    assert (first.duty, first.cpu_s) == (0.75, 7.0)
    assert (second.duty, second.cpu_s) == (0.25, 8.0)
    # read once, at the first observation of the end: a file changed after is not re-read
    (finals / "rank-2.final.json").write_bytes(_final(2, 1, 1, 1))
    assert [r.final for r in later.observe(SIM).ranks] == [first, second, None]


def test_a_running_simulation_reads_no_final_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path)
    h.backend.launch(_with_shim(h, monkeypatch))
    h.run_all()
    (h.case / ".rankpack" / "final" / "rank-0.final.json").write_bytes(_final(0, 1, 1, 1))
    obs = h.backend.observe(SIM)
    assert obs.phase is SimPhase.RUNNING and all(r.final is None for r in obs.ranks)
