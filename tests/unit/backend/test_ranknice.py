"""Per-rank weights inside a rank group: nice values from requests."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankpack.backend import ranknice


def test_largest_request_runs_at_nice_zero_and_ratios_map_to_the_kernels_table() -> None:
    assert ranknice.nices([182, 182, 909, 2727]) == [12, 12, 5, 0]
    assert ranknice.nices([1000, 1000]) == [0, 0]
    assert ranknice.nices([]) == []
    # 1/68 of the largest or less: the table's end
    assert ranknice.nices([1, 1000]) == [19, 0]
    assert ranknice.nice_for(0, 1000) == 19


@given(st.lists(st.integers(min_value=1, max_value=64_000), min_size=1, max_size=64))
def test_each_rank_gets_the_nearest_weight_in_ratio(requests: list[int]) -> None:
    nice = ranknice.nices(requests)
    largest = max(requests)
    assert nice[requests.index(largest)] == 0
    for req, n in zip(requests, nice, strict=True):
        assert 0 <= n <= ranknice.MAX_NICE
        want = math.log(req / largest * 1024)
        got = abs(math.log(ranknice.NICE_WEIGHTS[n]) - want)
        assert all(got <= abs(math.log(w) - want) + 1e-12 for w in ranknice.NICE_WEIGHTS)
    # larger requests never get a larger nice value
    order = sorted(range(len(requests)), key=lambda i: requests[i])
    assert [nice[i] for i in order] == sorted((nice[i] for i in order), reverse=True)


def test_set_nice_reaches_every_thread_of_a_process() -> None:
    # this process, with two more threads parked on an event; its nice is restored after
    park = threading.Event()
    threads = [threading.Thread(target=park.wait, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        ranknice.set_nice(os.getpid(), 7)
        tids = [int(t) for t in os.listdir(f"/proc/{os.getpid()}/task")]
        assert len(tids) >= 3
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in tids} == {7}
        assert ranknice.nice_of(os.getpid()) == 7
    finally:
        ranknice.set_nice(os.getpid(), 0)  # root: lowering it again is allowed
        park.set()
    assert ranknice.nice_of(os.getpid()) == 0


def test_a_process_that_is_gone_cannot_be_reniced() -> None:
    never = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids are below pid_max
    with pytest.raises(ProcessLookupError):
        ranknice.set_nice(never, 1)
    with pytest.raises(ProcessLookupError):
        ranknice.nice_of(never)
