"""A case's copy is bounded (issue 39): a small ``.gz`` that unpacks to more than a case
may hold, or a corrupt one, is refused with what to do; so is a case of too many files."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from rankpack.case import openfoam
from rankpack.errors import UserError


def _source(tmp_path: Path) -> openfoam.CaseSource:
    case = tmp_path / "case"
    (case / "system").mkdir(parents=True)
    (case / "system" / "controlDict").write_text("application simpleFoam;\n")
    return openfoam.CaseSource(case, "case", tutorial=False)


def test_a_gz_bomb_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _source(tmp_path)
    with gzip.open(src.path / "system" / "big.gz", "wb") as f:
        f.write(b"\0" * (4 << 20))  # 4 MiB of zeros: a few KB packed
    monkeypatch.setattr(openfoam, "MAX_CASE_BYTES", 1 << 20)
    with pytest.raises(UserError, match=r"system/big.gz unpacks to more than the case may hold"):
        openfoam.copy_case(src, tmp_path / "run")


def test_a_corrupt_gz_is_a_clear_refusal(tmp_path: Path) -> None:
    src = _source(tmp_path)
    (src.path / "system" / "bad.gz").write_bytes(b"not gzip at all")
    with pytest.raises(UserError, match=r"system/bad.gz cannot be unpacked"):
        openfoam.copy_case(src, tmp_path / "run")


def test_too_many_files_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _source(tmp_path)
    for i in range(20):
        (src.path / f"f{i}").write_text("x")
    monkeypatch.setattr(openfoam, "MAX_CASE_FILES", 10)
    with pytest.raises(UserError, match="holds more than 10 files"):
        openfoam.copy_case(src, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_plain_case_is_copied_and_unpacked(tmp_path: Path) -> None:
    src = _source(tmp_path)
    with gzip.open(src.path / "system" / "small.gz", "wb") as f:
        f.write(b"hello")
    openfoam.copy_case(src, tmp_path / "run")
    assert (tmp_path / "run" / "system" / "small").read_bytes() == b"hello"
    assert not (tmp_path / "run" / "system" / "small.gz").exists()
