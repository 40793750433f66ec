"""Sampling loop and summary, with records written by the C test writer or built in Python."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rankpack.errors import UserError
from rankpack.profile import shim
from rankpack.profile.records import RankRecord
from rankpack.profile.sampling import counters, sample_live, summarise


def _rec(rank: int, t: int, compute: int, mpi: int, updates: int) -> RankRecord:
    return RankRecord(
        rank=rank, world_size=2, pid=100 + rank, host="h", wait_mode="spin", seq=2 * updates,
        t_start_ns=0, t_update_ns=t, updates=updates, compute_ns=compute, mpi_ns=mpi,
        window_ns=0, window_end_ns=0, window_compute_ns=0, window_mpi_ns=0,
        t_last_change_ns=t, in_func=None, finalized=False, sleeps=0, sleep_ns=0,
        spin_limit_ns=0, trace_events=0, trace_dropped=0, funcs=(),
    )  # fmt: skip


def test_summarise_uses_steady_state_span() -> None:
    s = 1_000_000_000
    # start-up second is all MPI, then duty 0.25
    steady = [_rec(0, s + k * s, k * s // 4, s + 3 * k * s // 4, k + 1) for k in range(1, 10)]
    history = {0: [_rec(0, s, 0, s, 1), *steady], 1: []}
    summary = summarise(history, [500.0, 1000.0], skip_fraction=0.1)
    r0, r1 = summary.ranks
    assert r0.duty == pytest.approx(0.25)
    assert r0.compute_s + r0.mpi_s == pytest.approx(r0.span_s)
    assert r0.reclaimable_millis == pytest.approx(375.0)
    assert r1.duty is None and r1.reclaimable_millis == 0.0
    assert summary.reclaimable_millis_total == pytest.approx(375.0)
    js = summary.to_json()
    assert js["ranks"][0]["duty"] == 0.25 and js["reclaimable_millis_total"] == 375.0


def test_summarise_with_one_sample_falls_back_to_whole_run() -> None:
    history = {0: [_rec(0, 10, 2, 8, 1)]}
    assert counters(history[0])[0].t_ns == 0
    assert summarise(history, [1000.0]).ranks[0].duty == pytest.approx(0.2)


def test_sample_live_stops_when_job_ends(tmp_path: Path) -> None:
    calls: list[float] = []

    def wait_for_exit(timeout: float) -> bool:
        calls.append(timeout)
        return len(calls) == 3

    history = sample_live(tmp_path, 2, seconds=100, wait_for_exit=wait_for_exit, interval_s=0.5)
    assert calls == [0.5, 0.5, 0.5]
    assert history == {0: [], 1: []}


def test_sample_live_stops_at_deadline(tmp_path: Path) -> None:
    now = [0.0]

    def wait_for_exit(timeout: float) -> bool:
        now[0] += timeout
        return False

    sample_live(tmp_path, 1, seconds=2.5, wait_for_exit=wait_for_exit, clock=lambda: now[0])
    assert now[0] == pytest.approx(2.5)


def test_shim_library_missing_says_how_to_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shim.resources, "files", lambda _pkg: tmp_path)
    with pytest.raises(UserError, match=r"make -C shim install"):
        shim.shim_library("openmpi")
    with pytest.raises(UserError, match="unknown MPI flavour"):
        shim.shim_library("lam")


def test_shim_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "_lib" / "librankpack_pmpi.mpich.so"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    monkeypatch.setattr(shim.resources, "files", lambda _pkg: tmp_path)
    monkeypatch.setenv("LD_PRELOAD", "/other.so")
    monkeypatch.delenv("RANKPACK_SHIM_YIELD_US", raising=False)
    env = shim.shim_env(tmp_path / "live", "polite", tmp_path / "tr", flavour="mpich")
    assert env == {
        "LD_PRELOAD": f"{lib}:/other.so",
        "RANKPACK_SHIM_DIR": str(tmp_path / "live"),
        "RANKPACK_SHIM_WAIT": "polite",
        "RANKPACK_SHIM_YIELD_US": "1000",  # a yield phase: a scheduling point, no wake-up
        "RANKPACK_SHIM_TRACE": str(tmp_path / "tr"),
    }
    monkeypatch.setenv("RANKPACK_SHIM_YIELD_US", "200")  # the user's setting wins
    again = shim.shim_env(tmp_path, "polite", flavour="mpich", final_dir=tmp_path / "final")
    assert again["RANKPACK_SHIM_YIELD_US"] == "200"
    assert again["RANKPACK_SHIM_FINAL_DIR"] == str(tmp_path / "final")  # only when given
    with pytest.raises(UserError, match="unknown wait mode"):
        shim.shim_env(tmp_path, "nap")


def test_record_is_frozen() -> None:
    rec = _rec(0, 1, 1, 1, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.rank = 3  # type: ignore[misc]


def test_shim_env_passes_the_back_off_knobs_only_when_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for knob in shim.TUNING:
        monkeypatch.delenv(knob, raising=False)
    env = shim.shim_env(tmp_path, "polite")
    assert not set(shim.TUNING) & set(env)
    assert env["RANKPACK_SHIM_YIELD_US"] == shim.DEFAULT_YIELD_US == "1000"
    monkeypatch.setenv("RANKPACK_SHIM_SLEEP_MAX_US", "1000")
    env = shim.shim_env(tmp_path, "polite")
    assert env["RANKPACK_SHIM_SLEEP_MAX_US"] == "1000"
    assert "RANKPACK_SHIM_SLEEP_MIN_US" not in env
