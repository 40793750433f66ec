"""The Python record layout without the C side: unpublished, missing and torn records.
(The layout against the C header and records written by C: tests/integration/
test_profile_records_c.py.)"""

from __future__ import annotations

from pathlib import Path

from rankpack.profile import records
from rankpack.profile.records import RecordReader, read_record


def test_unpublished_and_missing_records_read_as_none(tmp_path: Path) -> None:
    assert read_record(tmp_path / "nope.rec") is None
    blank = tmp_path / "rank-0.rec"
    blank.write_bytes(bytes(records.RECORD_SIZE))
    assert read_record(blank) is None


def test_torn_record_gives_up_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.rec"
    data = bytearray(records.RECORD_SIZE)
    data[0:8] = (3).to_bytes(8, "little")  # writer stuck mid-update
    path.write_bytes(bytes(data))
    with RecordReader(path) as reader:
        assert reader.snapshot(max_tries=50) is None
