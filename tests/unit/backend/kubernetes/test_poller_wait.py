"""The poll thread's wait: the watch's next change, or an mpirun's exit file in its launcher
pod, whichever comes first (`Poller._wait`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rankpack.backend.kubernetes.poller import EXIT_LOOK_S
from tests.unit.backend.kubernetes.starting.test_podmode import PodHarness


class Watch:
    """The informer's `wait` as the poll thread uses it: sleeps ``timeout_s`` (or returns a
    newer version at once when ``change`` is set); ``on_call`` runs before each answer."""

    def __init__(self, on_call: Any = None, change: bool = False) -> None:
        self.calls: list[float] = []
        self.on_call = on_call
        self.change = change

    def wait(self, seen: int, timeout_s: float) -> int:
        self.calls.append(timeout_s)
        if self.on_call is not None:
            self.on_call(len(self.calls))
        if self.change:
            return seen + 1
        time.sleep(timeout_s)
        return seen


def test_an_exit_file_ends_the_wait_within_a_look(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.running()
    h.backend.poll_once()
    exit_file: Path = h.exit_file

    def write_on_the_third(n: int) -> None:
        if n == 3:
            exit_file.write_text("0\n")

    watch = Watch(write_on_the_third)
    h.backend._poller._wait(watch, 7, 30.0)  # type: ignore[arg-type]
    assert len(watch.calls) == 3  # it returned at the first look after the file came
    assert all(t <= EXIT_LOOK_S for t in watch.calls)


def test_a_change_ends_the_wait_at_once(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.running()
    h.backend.poll_once()
    watch = Watch(change=True)
    h.backend._poller._wait(watch, 7, 30.0)  # type: ignore[arg-type]
    assert watch.calls == [EXIT_LOOK_S]


def test_without_mpirun_running_in_a_pod_it_waits_whole(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.backend.launch(h.spec())  # created, not started: nothing to look for
    watch = Watch()
    h.backend._poller._wait(watch, 7, 0.3)  # type: ignore[arg-type]
    assert len(watch.calls) == 1 and 0.25 < watch.calls[0] <= 0.3


def test_an_exit_file_that_does_not_parse_does_not_end_the_wait(tmp_path: Path) -> None:
    h = PodHarness(tmp_path)
    h.running()
    h.backend.poll_once()
    h.exit_file.write_text("not a code")  # (what `follow` would not end it on either)
    watch = Watch()
    h.backend._poller._wait(watch, 7, 0.35)  # type: ignore[arg-type]
    assert len(watch.calls) >= 3 and all(t <= EXIT_LOOK_S for t in watch.calls)
