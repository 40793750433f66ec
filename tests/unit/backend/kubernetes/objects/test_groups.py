"""Rank groups (pure): table tests with named cases, and properties of `plan_groups`."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankpack.backend.kubernetes.objects import groups
from rankpack.backend.kubernetes.objects.groups import RankGroup
from rankpack.backend.protocol import BackendError, RankResources
from rankpack.quantities import MAX_RANKS

PLAN_CASES = [
    pytest.param(3, (), [(None, (0, 1, 2))], id="no-placement-one-group"),
    pytest.param(1, ("n0",), [("n0", (0,))], id="one-rank"),
    pytest.param(4, ("n0",) * 4, [("n0", (0, 1, 2, 3))], id="one-node"),
    pytest.param(
        5, ("n0", "n0", "n1", "n1", "n1"), [("n0", (0, 1)), ("n1", (2, 3, 4))], id="two-nodes"
    ),
    pytest.param(
        4,
        ("n0", "n1", "n0", "n0"),
        [("n0", (0,)), ("n1", (1,)), ("n0", (2, 3))],
        id="node-again-is-a-new-group",
    ),
    pytest.param(3, ("a", "b", "c"), [("a", (0,)), ("b", (1,)), ("c", (2,))], id="a-node-each"),
]


@pytest.mark.parametrize(("n_ranks", "nodes", "want"), PLAN_CASES)
def test_plan_groups(
    n_ranks: int, nodes: tuple[str, ...], want: list[tuple[str | None, tuple[int, ...]]]
) -> None:
    planned = groups.plan_groups(n_ranks, nodes)
    assert [(g.node, g.ranks) for g in planned] == want
    assert [g.index for g in planned] == list(range(len(want)))


@pytest.mark.parametrize(
    ("n_ranks", "nodes", "match"),
    [
        (3, ("n0", "n1"), "2 nodes for 3 ranks"),
        (1, ("n0", "n1"), "2 nodes for 1 ranks"),
        (0, (), "at least one rank"),
        (2, ("n0", ""), "empty name"),
    ],
    ids=["too-few-nodes", "too-many-nodes", "no-ranks", "empty-node-name"],
)
def test_plan_groups_refuses(n_ranks: int, nodes: tuple[str, ...], match: str) -> None:
    with pytest.raises(BackendError, match=match):
        groups.plan_groups(n_ranks, nodes)


@given(st.lists(st.sampled_from(["n0", "n1", "n2"]), min_size=1, max_size=40))
def test_every_rank_in_exactly_one_contiguous_group_on_its_node(nodes: list[str]) -> None:
    planned = groups.plan_groups(len(nodes), nodes)
    flat = [r for g in planned for r in g.ranks]
    assert flat == list(range(len(nodes)))  # each rank once, groups in order, contiguous
    assert [g.index for g in planned] == list(range(len(planned)))
    for g in planned:
        assert {nodes[r] for r in g.ranks} == {g.node}
        assert groups.group_of(planned, g.ranks[-1]) is g
    for before, after in itertools.pairwise(planned):
        assert before.node != after.node  # runs are maximal


def test_group_pod_names_and_lookup() -> None:
    planned = groups.plan_groups(4, ("n0", "n0", "n1", "n1"))
    assert [g.pod_name("s1") for g in planned] == ["rankpack-s1-g0", "rankpack-s1-g1"]
    assert groups.group_of(planned, 0).index == 0 and groups.group_of(planned, 3).index == 1
    with pytest.raises(BackendError, match="rank 4"):
        groups.group_of(planned, 4)


@pytest.mark.parametrize(
    ("index", "ranks"),
    [(0, ()), (0, (1, 3)), (0, (2, 1)), (-1, (0,)), (0, (-1, 0))],
    ids=["empty", "gap", "descending", "negative-index", "negative-rank"],
)
def test_a_group_is_a_run_of_ranks(index: int, ranks: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="rank group"):
        RankGroup(index, None, ranks)


RESOURCE_CASES = [
    pytest.param([RankResources(250)], RankResources(250), id="one-rank"),
    pytest.param([RankResources(250), RankResources(1000)], RankResources(1250), id="requests"),
    pytest.param(
        [RankResources(250, 500), RankResources(1000, 1000)],
        RankResources(1250, 1500),
        id="every-rank-limited",
    ),
]


@pytest.mark.parametrize(("ranks", "want"), RESOURCE_CASES)
def test_group_resources(ranks: list[RankResources], want: RankResources) -> None:
    assert groups.group_resources(ranks) == want


@pytest.mark.parametrize(
    ("ranks", "match"),
    [([RankResources(250), RankResources(1250, 1500)], "1 of a rank group's 2"), ([], "one")],
    ids=["mixed-limits", "no-ranks"],
)
def test_group_resources_refuses(ranks: list[RankResources], match: str) -> None:
    with pytest.raises(BackendError, match=match):
        groups.group_resources(ranks)


def test_nices_are_within_each_group() -> None:
    # 1:1:5:15 on one node is decision 0012's 12, 12, 5, 0; a group of its own is at 0
    requests = [100, 100, 500, 1500, 100, 200]
    ranks = [RankResources(r) for r in requests]
    planned = groups.plan_groups(6, ("n0",) * 4 + ("n1",) * 2)
    assert groups.group_nices(planned, ranks) == {0: 12, 1: 12, 2: 5, 3: 0, 4: 3, 5: 0}
    one = groups.plan_groups(6, ())
    assert groups.group_nices(one, ranks)[3] == 0 and groups.group_nices(one, ranks)[4] == 12
    with pytest.raises(BackendError, match="beyond"):
        groups.group_nices(planned, ranks[:5])


ANNOTATION_CASES = [
    pytest.param(RankGroup(0, None, (0, 1, 2, 3)), "0-3", id="run"),
    pytest.param(RankGroup(2, "n1", (5,)), "5", id="one-rank"),
    pytest.param(RankGroup(1, "n1", tuple(range(10, 4096))), "10-4095", id="up-to-the-last"),
]


@pytest.mark.parametrize(("group", "text"), ANNOTATION_CASES)
def test_ranks_annotation_round_trips(group: RankGroup, text: str) -> None:
    assert groups.ranks_annotation(group) == text
    assert groups.parse_ranks_annotation(text) == group.ranks


@pytest.mark.parametrize(
    "text",
    [
        "", "-", "3-", "-3", "0-3-5", "0,1", "0-3,5", " 0-3", "0-3\n", "0 - 3", "a-b", "+1",
        "01", "0-03", "3-3", "3-1", "0-4096", "4096", "99999", "1" * 5000, "０-３", "٣", "0x3",
        "1e3", "1_0",
    ],
    ids=lambda t: repr(t[:12]),
)  # fmt: skip
def test_ranks_annotation_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError):
        groups.parse_ranks_annotation(text)


@given(st.integers(0, MAX_RANKS - 1), st.integers(0, MAX_RANKS - 1))
def test_every_run_round_trips(a: int, b: int) -> None:
    group = RankGroup(0, None, tuple(range(min(a, b), max(a, b) + 1)))
    assert groups.parse_ranks_annotation(groups.ranks_annotation(group)) == group.ranks


@given(st.text(max_size=12))
def test_parsing_any_text_gives_a_run_or_value_error(text: str) -> None:
    try:
        ranks = groups.parse_ranks_annotation(text)
    except ValueError:
        return
    assert ranks and ranks[-1] < MAX_RANKS
    assert list(ranks) == list(range(ranks[0], ranks[-1] + 1))
    assert groups.ranks_annotation(RankGroup(0, None, ranks)) == text


UNPLACED_CASES = [
    pytest.param(
        [250, 250, 1500], {"n1": 2000, "n2": 500}, [(None, (0, 1, 2))], id="fits-the-roomiest"
    ),
    pytest.param([250, 250, 1500], {}, [(None, (0, 1, 2))], id="no-room-known"),
    # (too big for any node: on the roomiest, to wait there for room like any pod)
    pytest.param([100], {"n1": 0, "n2": 50}, [("n2", (0,))], id="one-rank-no-room"),
    pytest.param(
        [250, 250, 1500], {"b": 1300, "a": 1500}, [("a", (0, 1)), ("b", (2,))], id="roomiest-first"
    ),
    pytest.param(
        [500] * 5,
        {"n1": 1000, "n2": 1000, "n3": 1000},
        [("n1", (0, 1)), ("n2", (2, 3)), ("n3", (4,))],
        id="fills-in-order-ties-by-name",
    ),
    pytest.param(
        [500] * 4, {"a": 600, "b": 500}, [("a", (0,)), ("b", (1, 2, 3))], id="last-takes-the-rest"
    ),
    pytest.param([500, 500], {"a": 100, "b": 50}, [("a", (0,)), ("b", (1,))], id="none-fits"),
]


@pytest.mark.parametrize(("requests", "room", "want"), UNPLACED_CASES)
def test_plan_unplaced(
    requests: list[int], room: dict[str, int], want: list[tuple[str | None, tuple[int, ...]]]
) -> None:
    planned = groups.plan_unplaced(requests, room)
    assert [(g.node, g.ranks) for g in planned] == want
    assert [g.index for g in planned] == list(range(len(want)))


def test_plan_unplaced_refuses_no_ranks() -> None:
    with pytest.raises(BackendError, match="at least one rank"):
        groups.plan_unplaced([], {"n1": 1000})


@settings(max_examples=60)
@given(
    st.lists(st.integers(1, 3000), min_size=1, max_size=12),
    st.dictionaries(st.sampled_from(["n0", "n1", "n2", "n3"]), st.integers(0, 4000), max_size=4),
)
def test_an_unplaced_split_covers_every_rank_once_on_fewer_groups_than_nodes(
    requests: list[int], room: dict[str, int]
) -> None:
    planned = groups.plan_unplaced(requests, room)
    assert [r for g in planned for r in g.ranks] == list(range(len(requests)))
    if not room or sum(requests) <= max(room.values()):
        assert len(planned) == 1 and planned[0].node is None  # the scheduler places it
        return
    nodes = [g.node for g in planned]  # split: each node once, the roomiest first
    assert len(set(nodes)) == len(nodes) and set(nodes) <= set(room)
    assert [room[str(n)] for n in nodes] == sorted((room[str(n)] for n in nodes), reverse=True)
