"""Files a less-trusted party wrote (`rankpack.untrusted`): no link followed, no FIFO
waited on, no more read than asked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rankpack import untrusted
from rankpack.case.foamlog import LINE_MAX, LogFollower


def test_a_regular_file_is_read_up_to_the_cap(tmp_path: Path) -> None:
    f = tmp_path / "log"
    f.write_bytes(b"0123456789")
    assert untrusted.read_bytes(f, 4) == b"0123"
    assert untrusted.read_bytes(f, 100, offset=8) == b"89"


def test_a_link_a_fifo_and_a_directory_are_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("token")
    (tmp_path / "link").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo")
    for name in ("link", "fifo", "."):
        with pytest.raises(untrusted.NotARegularFile):
            untrusted.read_bytes(tmp_path / name, 100)
    with pytest.raises(FileNotFoundError):
        untrusted.read_bytes(tmp_path / "none", 100)


def test_appending_never_goes_through_a_link(tmp_path: Path) -> None:
    store = tmp_path / "operator.db"
    store.write_text("db")
    (tmp_path / "log.simpleFoam").symlink_to(store)
    with pytest.raises(untrusted.NotARegularFile):
        untrusted.open_append(tmp_path / "log.simpleFoam")
    assert store.read_text() == "db"
    fd = untrusted.open_append(tmp_path / "log.other")
    os.write(fd, b"x")
    os.close(fd)
    assert (tmp_path / "log.other").read_text() == "x"


def test_the_log_follower_reads_no_link_and_cuts_endless_lines(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("--> FOAM FATAL ERROR:\ntoken-do-not-leak\n")
    log = tmp_path / "log.simpleFoam"
    log.symlink_to(secret)
    assert LogFollower(log).finish().fatal is None
    log.unlink()
    log.write_text("x" * (3 * LINE_MAX) + "\nTime = 1\n")
    follower = LogFollower(log)
    follower.poll()
    assert len(follower._partial) <= LINE_MAX


def test_writing_replaces_a_link_and_never_writes_through_it(tmp_path: Path) -> None:
    store = tmp_path / "operator.db"
    store.write_text("db")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".rankpack").symlink_to(tmp_path)  # the case's own ".rankpack", a link out
    own = untrusted.own_dir(run / ".rankpack")
    assert own.is_dir() and not own.is_symlink()
    (own / "launch.json").symlink_to(store)
    untrusted.write_file(own / "launch.json", b"{}")
    assert store.read_text() == "db" and (own / "launch.json").read_text() == "{}"
    assert not (own / "launch.json").is_symlink()
    assert sorted(p.name for p in own.iterdir()) == ["launch.json"]


def test_an_exit_file_is_never_written_or_read_through_a_rank_made_link(tmp_path: Path) -> None:
    from rankpack.backend.kubernetes.starting import exitwrapper

    host_file = tmp_path / "passwd"
    host_file.write_text("root:x:0:0\n")
    exit_file = tmp_path / "mpirun.exit"
    exit_file.symlink_to(host_file)
    assert exitwrapper.read_exit(exit_file) is None  # (the link is not followed)
    exitwrapper.write_exit(exit_file, 3)
    assert host_file.read_text() == "root:x:0:0\n" and not exit_file.is_symlink()
    assert exitwrapper.read_exit(exit_file) == 3


def test_files_read_through_a_directory_descriptor_never_follow_a_link_put_in_its_place(
    tmp_path: Path,
) -> None:
    """A directory opened once (`open_dir`) is read by name; a link in place of it when it
    is opened is refused, and one put there afterwards changes nothing for the reader."""
    own, other = tmp_path / "final", tmp_path / "other"
    own.mkdir()
    other.mkdir()
    (own / "rank-0").write_text("mine")
    (other / "rank-0").write_text("theirs")
    (tmp_path / "link").symlink_to(other)
    with pytest.raises(NotADirectoryError):
        untrusted.open_dir(tmp_path / "link")
    fd = untrusted.open_dir(own)
    try:
        own.rename(tmp_path / "moved")
        own.symlink_to(other)
        assert untrusted.read_bytes(Path("rank-0"), 100, dir_fd=fd) == b"mine"
        (tmp_path / "moved" / "link").symlink_to(other / "rank-0")
        with pytest.raises(untrusted.NotARegularFile):
            untrusted.read_bytes(Path("link"), 100, dir_fd=fd)
    finally:
        os.close(fd)
