"""The Python record layout against the C header, and parsing a record written by C.

The C helper programs are built (make) and run as child processes: the integration tier."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rankpack.errors import UserError
from rankpack.profile import records
from rankpack.profile.records import read_record, read_records, set_wait_mode

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tools() -> Path:
    """The plain-C helper programs (need only a C compiler, not MPI)."""
    try:
        subprocess.run(["make", "-s", "-C", str(SHIM), "tools"], check=True, capture_output=True)
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot build shim tools: {exc}")
    return SHIM / "build"


def test_layout_matches_c_header(tools: Path) -> None:
    out = subprocess.run([str(tools / "record_layout")], check=True, capture_output=True, text=True)
    c_layout = {}
    for line in out.stdout.splitlines():
        name, a, b = line.split()
        c_layout[name] = (int(a), int(b))
    assert c_layout.pop("SIZE")[0] == records.RECORD_SIZE
    assert c_layout.pop("MAGIC")[0] == records.RECORD_MAGIC
    assert c_layout.pop("VERSION")[0] == records.RECORD_VERSION
    assert c_layout.pop("MAX_FUNCS")[0] == records.MAX_FUNCS
    assert c_layout.pop("FUNC_NAME_LEN")[0] == records.FUNC_NAME_LEN
    assert c_layout.pop("HOST_LEN")[0] == records.HOST_LEN
    assert c_layout == records.RECORD_OFFSETS


def test_parse_record_written_by_c(tools: Path, tmp_path: Path) -> None:
    path = tmp_path / "rank-2.rec"
    subprocess.run([str(tools / "record_writer"), "once", str(path)], check=True)
    rec = read_record(path)
    assert rec is not None
    assert (rec.rank, rec.world_size, rec.pid, rec.host) == (2, 4, 4242, "node-a")
    assert (rec.wait_mode, rec.wait_mode_requested, rec.wait_switches) == ("adaptive", "polite", 1)
    assert rec.seq == 2
    assert (rec.updates, rec.compute_ns, rec.mpi_ns) == (1000, 3000, 5000)
    assert rec.window_duty == pytest.approx(7 / 18)
    assert rec.duty == pytest.approx(3 / 8)
    assert rec.finalized
    assert rec.in_func == "MPI_Barrier"  # the writer sets in_func = k % 3 = 1, i.e. id 0
    assert [f.name for f in rec.funcs] == ["MPI_Barrier", "MPI_Allreduce", "MPI_Waitall"]
    assert [(f.calls, f.ns) for f in rec.funcs] == [(1000, 1000), (1000, 2000), (1000, 3000)]
    assert read_records(tmp_path) == {2: rec}


def test_wrong_version_is_a_user_error(tools: Path, tmp_path: Path) -> None:
    path = tmp_path / "rank-0.rec"
    subprocess.run([str(tools / "record_writer"), "once", str(path)], check=True)
    raw = bytearray(path.read_bytes())
    off = records.RECORD_OFFSETS["version"][0]
    raw[off : off + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="make -C shim install"):
        read_record(path)


def test_set_wait_mode_writes_only_the_control_word(tools: Path, tmp_path: Path) -> None:
    path = tmp_path / "rank-2.rec"
    subprocess.run([str(tools / "record_writer"), "once", str(path)], check=True)
    before = path.read_bytes()
    off, size = records.RECORD_OFFSETS["wait_ctl"]
    for mode, word in [("spin", 0), ("adaptive", 2), ("polite", 1)]:
        set_wait_mode(path, mode)
        after = path.read_bytes()
        assert int.from_bytes(after[off : off + size], "little") == word
        assert after[:off] + after[off + size :] == before[:off] + before[off + size :]
        rec = read_record(path)
        assert rec is not None and rec.wait_mode_requested == mode
        assert rec.wait_mode == "adaptive"  # what the rank last used: unchanged until it waits


def test_set_wait_mode_refuses_bad_input(tools: Path, tmp_path: Path) -> None:
    path = tmp_path / "rank-0.rec"
    with pytest.raises(UserError, match="no live record"):
        set_wait_mode(path, "polite")
    path.write_bytes(bytes(records.RECORD_SIZE))
    with pytest.raises(UserError, match="not published"):
        set_wait_mode(path, "polite")
    subprocess.run([str(tools / "record_writer"), "once", str(path)], check=True)
    with pytest.raises(UserError, match="unknown wait mode"):
        set_wait_mode(path, "sleepy")
    raw = bytearray(path.read_bytes())
    off = records.RECORD_OFFSETS["magic"][0]
    raw[off : off + 4] = (1).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="not a rankpack live record"):
        set_wait_mode(path, "spin")


def test_set_wait_modes_writes_every_rank_or_none(tools: Path, tmp_path: Path) -> None:
    from rankpack.profile.records import set_wait_modes

    for rank in (0, 1):
        subprocess.run(
            [str(tools / "record_writer"), "once", str(tmp_path / f"rank-{rank}.rec")], check=True
        )
    set_wait_modes(tmp_path, 2, "spin")
    assert {read_record(tmp_path / f"rank-{r}.rec").wait_mode_requested for r in (0, 1)} == {  # type: ignore[union-attr]
        "spin"
    }
    # rank 2 has not published: nothing is written, not even ranks 0 and 1
    with pytest.raises(UserError, match="rank 2's live record"):
        set_wait_modes(tmp_path, 3, "polite")
    assert {read_record(tmp_path / f"rank-{r}.rec").wait_mode_requested for r in (0, 1)} == {  # type: ignore[union-attr]
        "spin"
    }
    with pytest.raises(UserError, match="unknown wait mode"):
        set_wait_modes(tmp_path, 2, "sleepy")
