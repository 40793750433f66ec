"""Partition maths on synthetic meshes: exact counts, zones, sectors, edge cut."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankpack.case import partition as P
from rankpack.case.mesh import cell_centres, cell_graph
from rankpack.errors import UserError

from .meshgen import grid_mesh


def test_target_counts_largest_remainder() -> None:
    assert P.target_counts([1, 1, 5, 15], 12225) == [556, 556, 2778, 8335]
    assert P.target_counts([4, 3, 2, 1], 16000) == [6400, 4800, 3200, 1600]
    assert sum(P.target_counts([1, 2, 3], 10)) == 10


@pytest.mark.parametrize(
    ("weights", "n", "match"),
    [
        ([1, 1, 1], 2, "3 ranks but the mesh has only 2 cells"),
        ([1, 0], 10, "positive weight"),
        ([1, -2], 10, "positive weight"),
        ([1, 1e-9], 100, "weights cannot be met: rank 1 would get 0"),
        ([], 10, "at least one rank"),
    ],
)
def test_target_counts_bad_input(weights: list[float], n: int, match: str) -> None:
    with pytest.raises(UserError, match=match):
        P.target_counts(weights, n)


def test_edge_cut_hand_computed() -> None:
    # 2 x 2 grid, cells 0 1 / 2 3; split into columns {0,2} and {1,3}: faces 0-1 and 2-3.
    mesh = grid_mesh(2, 2)
    assignment = np.array([0, 1, 0, 1])
    assert P.edge_cut(mesh.owner, mesh.neighbour, assignment) == 2
    assert P.edge_cut(mesh.owner, mesh.neighbour, np.array([0, 0, 0, 0])) == 0
    assert P.edge_cut(mesh.owner, mesh.neighbour, np.array([0, 1, 1, 0])) == 4


@pytest.mark.parametrize(
    "weights", [[1, 1, 5, 15], [4, 3, 2, 1], [1] * 8 + [5] * 4 + [15] * 4, [1, 1], [3]]
)
def test_weighted_exact_counts(weights: list[float]) -> None:
    mesh = grid_mesh(40, 30)
    part = P.weighted(cell_graph(mesh), weights)
    assert part.shape == (1200,)
    assert part.min() >= 0 and part.max() < len(weights)
    counts = np.bincount(part, minlength=len(weights)).tolist()
    assert counts == P.target_counts(weights, 1200)


def test_equal_is_balanced_and_cuts_less_than_strips() -> None:
    mesh = grid_mesh(40, 40)
    part = P.equal(cell_graph(mesh), 4)
    assert np.bincount(part).tolist() == [400] * 4
    strips = np.arange(1600) % 40 // 10  # four vertical strips: 3 cuts of 40 faces
    assert P.edge_cut(mesh.owner, mesh.neighbour, part) <= P.edge_cut(
        mesh.owner, mesh.neighbour, strips
    )


def test_rebalance_moves_cells_across_ranks() -> None:
    mesh = grid_mesh(30, 1)  # a chain: ranks 0|1|2 in a row, rank 0 far too big
    g = cell_graph(mesh)
    start = np.array([0] * 20 + [1] * 5 + [2] * 5)
    part = P.rebalance(g, start, [10, 10, 10])
    assert np.bincount(part).tolist() == [10, 10, 10]


def test_vertex_weights_balance_cost() -> None:
    mesh = grid_mesh(20, 20)
    cost = np.ones(400, dtype=np.int64)
    cost[:200] = 3  # the lower half costs three times as much
    part = P.weighted(cell_graph(mesh), [1, 1], vertex_weights=cost)
    load = np.bincount(part, weights=cost)
    assert abs(load[0] - load[1]) / load.sum() < 0.05


def _ring_centres(n: int = 4000) -> np.ndarray:
    rng = np.random.default_rng(1)
    xy = rng.uniform(-1, 1, size=(n, 2))
    return np.column_stack([xy, np.zeros(n)])


def test_concentric_heaviest_innermost_with_exact_ratios() -> None:
    centres = _ring_centres()
    center = np.zeros(3)
    weights = [4.0, 3.0, 2.0, 1.0]
    part = P.concentric(centres, weights, center)
    assert np.bincount(part).tolist() == [1600, 1200, 800, 400]
    r = np.linalg.norm(centres, axis=1)
    for inner, outer in [(0, 1), (1, 2), (2, 3)]:
        assert r[part == inner].max() <= r[part == outer].min()


def test_concentric_sparse_ranks_outermost_and_sectors_equal() -> None:
    centres = _ring_centres(3200)
    weights = [1.0] * 8 + [5.0] * 4 + [15.0] * 4
    part = P.concentric(centres, weights, np.zeros(3))
    counts = np.bincount(part, minlength=16)
    assert counts.tolist() == P.target_counts(weights, 3200)
    r = np.linalg.norm(centres, axis=1)
    dense, medium, sparse = range(12, 16), range(8, 12), range(8)
    assert max(r[np.isin(part, dense)]) <= min(r[np.isin(part, medium)])
    assert max(r[np.isin(part, medium)]) <= min(r[np.isin(part, sparse)])
    # Sectors: within the sparse zone, ranks 0..7 occupy consecutive angle ranges.
    angle = np.arctan2(centres[:, 1], centres[:, 0])
    upper = [angle[part == k].max() for k in sparse]
    lower = [angle[part == k].min() for k in sparse]
    assert all(upper[k] <= lower[k + 1] for k in range(7))


def test_zones_order_and_grouping() -> None:
    zs = P.zones([1, 5, 1, 15])
    assert [(z.weight, z.ranks) for z in zs] == [(15, (3,)), (5, (1,)), (1, (0, 2))]


def test_concentric_on_grid_mean_distance_grows_outward() -> None:
    mesh = grid_mesh(30, 30)
    centres = cell_centres(mesh)
    center = np.array([15.0, 15.0, 0.05])
    part = P.concentric(centres, [4, 3, 2, 1], center)
    means = P.mean_distances(centres, center, part, 4)
    assert list(means) == sorted(means)


@settings(max_examples=30, deadline=None)
@given(
    weights=st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=12),
    n=st.integers(min_value=12, max_value=500),
)
def test_concentric_every_cell_once_with_target_counts(weights: list[int], n: int) -> None:
    centres = _ring_centres(n)
    w = [float(x) for x in weights]
    try:
        targets = P.target_counts(w, n)
    except UserError:
        return
    part = P.concentric(centres, w, np.zeros(3))
    assert part.shape == (n,)
    assert np.bincount(part, minlength=len(w)).tolist() == targets
