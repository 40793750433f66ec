"""Run-directory names: stages started at the same moment never share one."""

from __future__ import annotations

import threading
from pathlib import Path

from rankpack.case import staging


def test_stages_in_the_same_second_get_distinct_directories(tmp_path: Path) -> None:
    got: list[Path] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def pick() -> None:
        start.wait()
        d = staging.new_run_dir(tmp_path / "runs", "pitzDaily", 2)
        with lock:
            got.append(d)

    threads = [threading.Thread(target=pick) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 8  # each reserved its own (the old exists() check raced)
    assert all(d.is_dir() and not any(d.iterdir()) for d in got)
