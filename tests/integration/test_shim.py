"""The PMPI shim with real MPI programs, under Open MPI and MPICH (seed 001 §3)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rankpack.profile.finals import read_finals
from rankpack.profile.records import (
    RankRecord,
    RecordReader,
    read_record,
    read_records,
    set_wait_mode,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim"
BUILD = SHIM / "build"
FLAVOURS = ["openmpi", "mpich"]


@pytest.fixture(scope="module")
def built() -> Path:
    subprocess.run(["make", "-s", "-C", str(SHIM), "all", "install"], check=True)
    return BUILD


def mpirun(flavour: str, n: int, env: dict[str, str], argv: list[str]) -> list[str]:
    if flavour == "openmpi":
        cmd = ["mpirun.openmpi", "-np", str(n), "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        for name in env:
            cmd += ["-x", name]
    else:
        cmd = ["mpirun.mpich", "-np", str(n), "-envlist", ",".join(env)]
    return cmd + argv


def run_mpi(flavour: str, n: int, shim_vars: dict[str, str], argv: list[str]) -> str:
    env = {"LD_PRELOAD": str(BUILD / f"librankpack_pmpi.{flavour}.so"), **shim_vars}
    full_env = {**os.environ, **env}
    out = subprocess.run(
        mpirun(flavour, n, env, argv),
        env=full_env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("wait", ["spin", "polite"])
def test_imbalance_duty_cycles(built: Path, tmp_path: Path, flavour: str, wait: str) -> None:
    """Rank 0 computes k=4 times longer than the others (2 cores here).

    Compute is a sleep so the designed times do not depend on how ranks share cores:
    designed duty is 1/k = 0.25 for ranks >= 1 and ~1 for rank 0. The shim's whole-run duty
    must match the program's own clock within 2 points, and the design within 5. Spinning
    ranks are 2 (one per core): 4 spinning ranks on 2 cores time-share inside every
    Allreduce, which distorts rank 0's designed duty (measured ~0.8) - that is the problem
    polite waiting solves, so the polite case uses 4 ranks where collectives can wait politely
    (Open MPI's progress hook). MPICH has no such hook and its blocking collectives stay
    spinning (docs/decisions/0005-shim-transparency.md), so it gets 2 ranks in every mode.
    """
    k, n, compute_us = 4, 120, 2000
    n_ranks = 4 if (wait, flavour) == ("polite", "openmpi") else 2
    out = run_mpi(
        flavour,
        n_ranks,
        {"RANKPACK_SHIM_DIR": str(tmp_path), "RANKPACK_SHIM_WAIT": wait},
        [str(built / flavour / "imbalance"), "-k", str(k), "-n", str(n), "-c", str(compute_us),
         "-m", "sleep"],
    )  # fmt: skip
    own = {int(m[1]): float(m[2]) for m in re.finditer(r"rank (\d+) .*measured_duty ([\d.]+)", out)}
    recs = read_records(tmp_path, n_ranks)
    assert sorted(recs) == list(range(n_ranks))
    for rank, rec in recs.items():
        assert rec.finalized and rec.wait_mode == wait
        calls = {f.name: f.calls for f in rec.funcs}
        assert calls["MPI_Allreduce"] == n
        assert rec.duty is not None
        assert rec.duty == pytest.approx(own[rank], abs=0.02)
        designed = 1.0 if rank == 0 else 1.0 / k
        assert rec.duty == pytest.approx(designed, abs=0.05)


def test_reader_never_sees_torn_or_decreasing_records(built: Path, tmp_path: Path) -> None:
    path = tmp_path / "rank-0.rec"
    # The writer updates as fast as it can (the most adversarial writer there is) until the
    # reader has what it needs; on a busy 2-core machine consistent copies come at an uneven
    # rate, so the test reads until it has enough of them rather than for a fixed time.
    writer = subprocess.Popen(
        [str(built / "record_writer"), "spin", str(path), "60"], stdout=subprocess.DEVNULL
    )
    snapshots = attempts = 0
    last = 0
    try:
        with RecordReader(path) as reader:
            deadline = time.monotonic() + 45
            while writer.poll() is None and time.monotonic() < deadline:
                if attempts >= 2000 and snapshots >= 100:
                    break
                rec = reader.snapshot()
                attempts += 1
                if rec is None:  # gave up: the writer was mid-update on every try
                    continue
                k = rec.updates
                assert k >= last, "counter went backwards"
                assert (rec.compute_ns, rec.mpi_ns, rec.t_update_ns) == (3 * k, 5 * k, k)
                assert (rec.window_compute_ns, rec.window_mpi_ns) == (7 * k, 11 * k)
                assert all(f.calls == k and f.ns == k * (i + 1) for i, f in enumerate(rec.funcs)), (
                    "torn funcs array"
                )
                last = k
                snapshots += 1
            still_writing = writer.poll() is None
    finally:
        writer.kill()
        writer.wait(timeout=10)
    # A writer that does nothing but update is inside its critical section most of the time,
    # so many snapshots give up (None) instead of waiting; the shim publishes every 2 ms.
    assert still_writing, "the writer stopped before the reader had read enough"
    assert attempts >= 2000 and snapshots >= 100, (
        f"{snapshots} consistent copies in {attempts} tries"
    )
    assert last > 10 * snapshots  # the writer really ran at full speed meanwhile


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_trace_csv_written_and_never_overwritten(built: Path, tmp_path: Path, flavour: str) -> None:
    trace = tmp_path / "trace"
    shim_vars = {"RANKPACK_SHIM_DIR": str(tmp_path / "live"), "RANKPACK_SHIM_TRACE": str(trace)}
    argv = [str(built / flavour / "imbalance"), "-k", "2", "-n", "20", "-c", "200"]
    run_mpi(flavour, 2, shim_vars, argv)
    first = (trace / "rank-0.csv").read_text()
    run_mpi(flavour, 2, shim_vars, argv)
    assert (trace / "rank-0.csv").read_text() == first
    assert sorted(p.name for p in trace.iterdir()) == [
        "rank-0.1.csv", "rank-0.csv", "rank-1.1.csv", "rank-1.csv",
    ]  # fmt: skip
    lines = first.splitlines()
    assert lines[0] == "rank,function,enter_us,exit_us"
    assert len(lines) == 1 + 20
    rank, func, enter, leave = lines[1].split(",")
    assert (rank, func) == ("0", "MPI_Allreduce") and float(leave) >= float(enter)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("finalize", [True, False])
def test_final_records_are_written_at_finalize_or_at_exit(
    built: Path, tmp_path: Path, flavour: str, finalize: bool
) -> None:
    """Each rank writes its final record once, whole, mode 0644, into a directory it
    creates: at MPI_Finalize, or at exit when the program never calls it (``-x``). Its duty
    is the program's own clock's, its wall time the program's, its CPU time what a rank that
    sleeps (rank 0) or spins in the Allreduce (rank 1) can have used. Without MPI_Finalize
    one rank alone: the launcher kills a job's other ranks once one exits so, and a rank
    killed between its output and its exit writes nothing (as a rank killed by a signal)."""
    final = tmp_path / "final" / "below"
    n_ranks = 2 if finalize else 1
    env = {
        "LD_PRELOAD": str(BUILD / f"librankpack_pmpi.{flavour}.so"),
        "RANKPACK_SHIM_DIR": str(tmp_path / "live"),
        "RANKPACK_SHIM_FINAL_DIR": str(final),
    }
    argv = [str(built / flavour / "imbalance"), "-k", "4", "-n", "50", "-c", "2000", "-m", "sleep",
            *([] if finalize else ["-x"])]  # fmt: skip
    out = subprocess.run(mpirun(flavour, n_ranks, env, argv), env={**os.environ, **env},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 or not finalize, out.stderr  # (Open MPI's mpirun: 1 without)
    line = re.compile(r"rank (\d+) .*wall_s ([\d.]+) measured_duty ([\d.]+)")
    own = {int(m[1]): (float(m[2]), float(m[3])) for m in line.finditer(out.stdout)}
    assert sorted(own) == list(range(n_ranks))
    names = sorted(p.name for p in final.iterdir())
    assert names == [f"rank-{r}.final.json" for r in range(n_ranks)]  # no temporary left
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in final.iterdir())
    finals = read_finals(final, n_ranks)
    assert sorted(finals) == list(range(n_ranks))
    for rank, rec in finals.items():
        wall, duty = own[rank]
        assert rec.finalized is finalize and rec.wait_mode == "spin"
        assert rec.duty == pytest.approx(duty, abs=0.03)
        assert wall <= rec.wall_s < wall + 0.5
        assert 0 < rec.cpu_s < 1.5 * rec.wall_s + 0.5
    if finalize:  # rank 1 spins in the Allreduce three quarters of the time; rank 0 sleeps
        assert finals[1].cpu_s > 2 * finals[0].cpu_s


@pytest.mark.parametrize("wait", ["polite", "adaptive"])
def test_polite_waits_keep_results_and_free_the_core(
    built: Path, tmp_path: Path, wait: str
) -> None:
    """Waiting ranks sleep instead of spinning, in every wait and in every run.

    Rank 1 waits ~9 ms in each of its 100 Allreduces, so it sleeps at least once in each
    (no yield phase, as rankpack runs it). Three runs: in about one Open MPI run of three,
    opal_progress reports "events" on every poll for the whole job; the shim used to take
    that for progress and spun through every wait (1-96 sleeps where 1 400 are due)."""
    for attempt in range(3):
        live = tmp_path / str(attempt)
        run_mpi(
            "openmpi",
            2,
            {"RANKPACK_SHIM_DIR": str(live), "RANKPACK_SHIM_WAIT": wait,
             "RANKPACK_SHIM_YIELD_US": "0"},
            [str(built / "openmpi" / "imbalance"), "-k", "10", "-n", "100", "-c", "1000"],
        )  # fmt: skip
        rec = read_records(live, 2)[1]
        assert rec.finalized and rec.sleeps >= 100, (attempt, rec.sleeps)
        assert rec.duty == pytest.approx(0.1, abs=0.05)


def test_profile_cli_end_to_end(built: Path, tmp_path: Path) -> None:
    plot = tmp_path / "duty.png"
    out = subprocess.run(
        [sys.executable, "-m", "rankpack", "profile", "--ranks", "2", "--seconds", "20",
         "--json", "--plot", str(plot), "--workdir", str(tmp_path), "--",
         str(built / "openmpi" / "imbalance"), "-k", "3", "-n", "150", "-c", "2000", "-m", "sleep"],
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    data = json.loads(out.stdout)
    assert data["exit_code"] == 0
    ranks = data["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["duty"] == pytest.approx(1.0, abs=0.06)
    assert ranks[1]["duty"] == pytest.approx(1 / 3, abs=0.06)
    assert ranks[1]["reclaimable_millis"] == pytest.approx(1000 * (1 - ranks[1]["duty"]), abs=1)
    assert data["reclaimable_millis_total"] == pytest.approx(
        sum(r["reclaimable_millis"] for r in ranks), abs=1
    )
    assert plot.stat().st_size > 1000


def test_profile_cli_bad_input_is_one_line(built: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rankpack", "profile", "--ranks", "2", "--", "/nonexistent/app"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "not found" in out.stderr


def _wait_for_record(
    path: Path, cond: Callable[[RankRecord], bool], timeout_s: float
) -> RankRecord:
    """The first snapshot of `path` that satisfies `cond`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rec = read_record(path)
        if rec is not None and cond(rec):
            return rec
        time.sleep(0.02)
    raise AssertionError(f"{path}: condition not met within {timeout_s} s")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_wait_mode_switches_live(built: Path, tmp_path: Path, flavour: str) -> None:
    """The controller's control word switches a running program spin -> polite -> spin.

    Rank 1 waits ~3 ms in every Allreduce. Under Open MPI (progress hook) polite waiting
    sleeps there, so `sleeps` grows only while the word says polite; MPICH's collectives stay
    spinning (no hook), but its ranks still take up the mode at the next wait.
    """
    env = {"LD_PRELOAD": str(BUILD / f"librankpack_pmpi.{flavour}.so"),
           "RANKPACK_SHIM_DIR": str(tmp_path), "RANKPACK_SHIM_WAIT": "spin"}  # fmt: skip
    argv = [str(built / flavour / "imbalance"), "-k", "4", "-n", "1500", "-c", "1000",
            "-m", "sleep"]  # fmt: skip
    proc = subprocess.Popen(
        mpirun(flavour, 2, env, argv), env={**os.environ, **env}, stdout=subprocess.DEVNULL
    )
    paths = [tmp_path / f"rank-{r}.rec" for r in range(2)]
    try:
        rec = _wait_for_record(paths[1], lambda r: r.updates > 10, 30)
        assert (rec.wait_mode, rec.wait_mode_requested, rec.sleeps) == ("spin", "spin", 0)
        for path in paths:
            set_wait_mode(path, "polite")
        polite = _wait_for_record(paths[1], lambda r: r.wait_mode == "polite", 10)
        assert polite.wait_mode_requested == "polite" and polite.wait_switches == 1
        if flavour == "openmpi":
            _wait_for_record(paths[1], lambda r: r.sleeps > 0, 10)
        for path in paths:
            set_wait_mode(path, "spin")
        spin = _wait_for_record(paths[1], lambda r: r.wait_mode == "spin", 10)
        time.sleep(0.3)  # several more waits, all spinning
        later = read_record(paths[1])
        assert later is not None and later.updates > spin.updates
        assert later.sleeps == spin.sleeps
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    final = [read_record(p) for p in paths]
    assert all(r is not None and r.finalized for r in final)
    assert [(r.wait_mode, r.wait_switches) for r in final if r] == [("spin", 2)] * 2
