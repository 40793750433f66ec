"""The open room's `fits` (issue 29): it looks at as many nodes as the launch has ranks and
remembers its answers until a launch takes room, and says what placing rank by rank on
the node with the most free over all open nodes says."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from rankpack.controller.room import Room


def _room(frees: list[int], total: int, unplaced: int) -> Room:
    room = Room(total_millis=total, unplaced_millis=unplaced)
    room.heap = [(-f, i, f"n{i}") for i, f in enumerate(frees)]
    heapq.heapify(room.heap)
    return room


def _fits_everywhere(room: Room, requests: list[int]) -> bool:
    """Rank by rank on the open node with the most free, over every open node."""
    frees = [-f for f, _, _ in room.heap]
    if sum(requests) > max(0, min(room.total_millis, sum(frees) - room.unplaced_millis)):
        return False
    heap = [-f for f in frees]
    heapq.heapify(heap)
    for r in sorted(requests, reverse=True):
        most = -heap[0] if heap else 0
        if most < r:
            return False
        heapq.heapreplace(heap, -(most - r))
    return True


requests_st = st.lists(st.integers(1, 4000), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    frees=st.lists(st.integers(1, 8000), max_size=40),
    total=st.integers(0, 100_000),
    unplaced=st.integers(0, 5000),
    asks=st.lists(st.tuples(requests_st, st.booleans()), min_size=1, max_size=8),
)
def test_fits_as_placing_over_every_open_node_also_after_launches_take_room(
    frees: list[int], total: int, unplaced: int, asks: list[tuple[list[int], bool]]
) -> None:
    room = _room(frees, total, unplaced)
    for requests, launch in asks:
        expected = _fits_everywhere(room, requests)
        assert room.fits(requests) is expected
        assert room.fits(list(reversed(requests))) is expected  # remembered, any order
        if launch and expected:
            room.take(requests)


def test_a_launch_that_takes_room_is_seen_by_the_next_question() -> None:
    room = _room([2000, 1000], total=10_000, unplaced=0)
    assert room.fits([1000, 1000])
    room.take([1000, 1000])  # one rank on each: 1000 and 0 left
    assert not room.fits([1000, 1000])
    assert room.fits([1000])
    assert room.open_millis == 1000
