"""The shim's final records as `rankpack.profile.finals` reads them: what a rank wrote is
kept, what is not exactly such a record (or not where, or not whose, it should be) is left
out without an error."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankpack.profile.finals import MAX_BYTES, FinalRecord, parse_final, read_finals


def record(of: int = 0, **changes: Any) -> dict[str, Any]:
    """A final record as the shim writes it (rank ``of`` of 2), with ``changes``."""
    base: dict[str, Any] = {
        "version": 1, "rank": of, "world_size": 2, "pid": 4242, "host": "node-1.local",
        "compute_ns": 3_000_000_000, "mpi_ns": 1_000_000_000, "cpu_ns": 3_900_000_000,
        "wall_ns": 4_000_000_000, "finalized": 1, "wait_mode": 1, "wait_switches": 2,
        "sleeps": 17,
    }  # fmt: skip
    return {**base, **changes}


def write(directory: Path, rank: int, data: dict[str, Any] | bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    (directory / f"rank-{rank}.final.json").write_bytes(raw)


def test_every_rank_written_is_read_with_its_totals(tmp_path: Path) -> None:
    write(tmp_path, 0, record(0))
    write(tmp_path, 1, record(1, compute_ns=0, mpi_ns=0, finalized=0, wait_mode=0))
    finals = read_finals(tmp_path, 2)
    assert finals[0] == FinalRecord(
        rank=0, compute_s=3.0, mpi_s=1.0, cpu_s=3.9, wall_s=4.0, finalized=True,
        wait_mode="polite", wait_switches=2,
    )  # fmt: skip
    assert finals[0].duty == pytest.approx(0.75)
    assert not finals[1].finalized and finals[1].wait_mode == "spin"
    assert finals[1].duty is None  # timed nothing: no duty, not 0


def test_a_missing_rank_and_a_missing_directory_give_nothing(tmp_path: Path) -> None:
    write(tmp_path, 1, record(1))
    assert sorted(read_finals(tmp_path, 2)) == [1]
    assert read_finals(tmp_path / "none", 2) == {}


def test_links_are_never_followed(tmp_path: Path) -> None:
    """A rank's file that is a link to another's record, and a final directory that is a
    link to another run's: neither is read."""
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere, 0, record(0))
    write(elsewhere, 1, record(1))
    finals = tmp_path / "final"
    finals.mkdir()
    (finals / "rank-0.final.json").symlink_to(elsewhere / "rank-0.final.json")
    write(finals, 1, record(1))
    assert sorted(read_finals(finals, 2)) == [1]
    (tmp_path / "linked").symlink_to(elsewhere)
    assert read_finals(tmp_path / "linked", 2) == {}


def test_an_oversized_file_a_fifo_and_a_directory_are_left_out(tmp_path: Path) -> None:
    padded = json.dumps(record(0, world_size=3)).encode()
    write(tmp_path, 0, padded + b" " * (MAX_BYTES + 1 - len(padded)))  # valid JSON, too long
    os.mkfifo(tmp_path / "rank-1.final.json")  # never waited on
    (tmp_path / "rank-2.final.json").mkdir()
    assert read_finals(tmp_path, 3) == {}
    write(tmp_path, 0, padded + b" " * (MAX_BYTES - len(padded)))  # exactly the cap: kept
    assert sorted(read_finals(tmp_path, 3)) == [0]


@pytest.mark.parametrize(
    "changes",
    [
        {"rank": 1},  # another rank's record under rank 0's name
        {"world_size": 3},  # a run of another size
        {"version": 2},
        {"compute_ns": -1},
        {"cpu_ns": 10**18},
        {"wall_ns": 1.5},
        {"mpi_ns": "1"},
        {"finalized": True},  # a bool is not the integer the shim writes
        {"finalized": 2},
        {"wait_mode": 3},
        {"pid": 0},
        {"host": "a b"},
        {"host": "x" * 64},
        {"extra": 1},
    ],
)
def test_a_record_not_exactly_as_the_shim_writes_is_left_out(changes: dict[str, Any]) -> None:
    assert parse_final(json.dumps(record(0, **changes)).encode(), 0, 2) is None


def test_a_record_missing_a_field_or_not_an_object_is_left_out() -> None:
    partial = record(0)
    del partial["sleeps"]
    for data in (partial, [record(0)], 1, None):
        assert parse_final(json.dumps(data).encode(), 0, 2) is None
    for raw in (b"", b"{", b"\xff\xfe", b"[" * 3000 + b"]" * 3000, b'{"rank": NaN}'):
        assert parse_final(raw, 0, 2) is None


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    parsed = parse_final(data, 0, 2)
    assert parsed is None or parsed.rank == 0


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(record(0))), _JSON)
def test_any_other_value_of_a_field_is_kept_only_if_valid(field: str, value: Any) -> None:
    """One field changed to anything JSON can hold: the result is either None or a record
    whose numbers are the ones written, never an exception or a value out of its bounds."""
    data = json.dumps(record(0, **{field: value})).encode()
    parsed = parse_final(data, 0, 2)
    if parsed is not None:
        assert type(value) is type(record(0)[field])
        assert parsed.compute_s >= 0 and parsed.cpu_s >= 0 and parsed.wall_s < 1e9
