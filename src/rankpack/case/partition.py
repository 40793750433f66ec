"""Cell-to-rank assignments whose sizes follow a weight vector. Pure functions, no I/O.

Called by `rankpack.case.decomposition.decompose_case` (``rankpack decompose`` and
``rankpack run --decompose``). Three methods:

- ``equal``: METIS k-way on the cell graph with equal target fractions.
- ``weighted``: METIS k-way with target fractions = normalised weights (``tpwgts``),
  optionally with per-cell vertex weights; then a small boundary fix-up moves cells
  between neighbouring ranks until every rank has exactly its target count (METIS
  only promises a few per cent).
- ``concentric`` (seed 000 §4.2.2, seed 001 §5.1): cells ranked by distance from a centre
  and cut into radial zones, one zone per distinct weight, **heaviest zone innermost**;
  ranks sharing a weight split their zone into equal angular sectors. Ranks keep their
  index: rank i always gets ``target_counts(...)[i]`` cells.

Target cell counts use the largest-remainder rule (as the CPU plan does for millicores),
so they sum exactly to the cell count.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from rankpack.case.mesh import CellGraph, FloatArray, IntArray
from rankpack.errors import UserError


class Method(StrEnum):
    EQUAL = "equal"
    WEIGHTED = "weighted"
    CONCENTRIC = "concentric"


def validate_weights(weights: list[float]) -> None:
    if not weights:
        raise UserError("a decomposition needs at least one rank")
    for i, w in enumerate(weights):
        if not math.isfinite(w) or w <= 0:
            raise UserError(
                f"weight of rank {i} is {w:g}; every rank needs a positive weight (cells)"
            )


def target_counts(weights: list[float], n_cells: int) -> list[int]:
    """Cells per rank proportional to ``weights``, summing to ``n_cells``, each at least 1."""
    validate_weights(weights)
    n = len(weights)
    if n > n_cells:
        raise UserError(f"{n} ranks but the mesh has only {n_cells} cells; use at most {n_cells}")
    total = math.fsum(weights)
    exact = [n_cells * w / total for w in weights]
    base = [math.floor(x) for x in exact]
    order = sorted(range(n), key=lambda i: (-(exact[i] - base[i]), i))
    for i in order[: n_cells - sum(base)]:
        base[i] += 1
    empty = [i for i, c in enumerate(base) if c == 0]
    if empty:
        raise UserError(
            f"weights cannot be met: rank {empty[0]} would get 0 of {n_cells} cells "
            f"(weight {weights[empty[0]]:g} of {total:g}); use fewer ranks or less extreme weights"
        )
    return base


def edge_cut(owner: IntArray, neighbour: IntArray, assignment: IntArray) -> int:
    """Internal faces whose two cells are on different ranks (``owner`` of internal faces)."""
    n_internal = len(neighbour)
    return int(np.count_nonzero(assignment[owner[:n_internal]] != assignment[neighbour]))


# --- graph partitions -------------------------------------------------------------------


def weighted(
    graph: CellGraph,
    weights: list[float],
    *,
    vertex_weights: IntArray | None = None,
    seed: int = 0,
) -> IntArray:
    """METIS k-way partition with target fractions ∝ ``weights``.

    Without ``vertex_weights`` the result has exactly ``target_counts(weights, n)`` cells
    per rank. With them, METIS balances the summed vertex weight (within its tolerance).
    """
    n = graph.n_cells
    targets = target_counts(weights, n)
    k = len(weights)
    if k == 1:
        return np.zeros(n, dtype=np.int64)
    import pymetis

    total = math.fsum(weights)
    fractions = [w / total for w in weights]
    # Rounding can push the sum a hair above 1, which METIS rejects.
    fractions[-1] = max(0.0, 1.0 - math.fsum(fractions[:-1]))
    options = pymetis.Options(seed=seed, ufactor=1)
    result = pymetis.part_graph(
        k,
        adjacency=pymetis.CSRAdjacency(graph.xadj, graph.adjncy),
        vweights=None if vertex_weights is None else np.asarray(vertex_weights, dtype=np.int64),
        eweights=None if graph.eweights is None else graph.eweights,
        tpwgts=fractions,
        options=options,
    )
    part = np.asarray(result.vertex_part, dtype=np.int64)
    if vertex_weights is None:
        part = rebalance(graph, part, targets)
    return part


def equal(graph: CellGraph, n_ranks: int, *, seed: int = 0) -> IntArray:
    return weighted(graph, [1.0] * n_ranks, seed=seed)


def rebalance(graph: CellGraph, part: IntArray, targets: list[int]) -> IntArray:
    """Move boundary cells between neighbouring ranks until each has its target count.

    Each step takes the most overfull rank, finds the nearest underfull rank in the graph
    of ranks that touch, and moves cells one hop along that path: cells of the
    overfull rank that touch the next rank (those with most faces there first).
    """
    part = part.copy()
    k = len(targets)
    want = np.asarray(targets, dtype=np.int64)
    src = np.repeat(np.arange(graph.n_cells), np.diff(graph.xadj))
    dst = graph.adjncy
    for _ in range(50 * k + 100):
        excess = np.bincount(part, minlength=k) - want
        if not excess.any():
            return part
        a = int(np.argmax(excess))
        pa = part[src]
        pb = part[dst]
        cross = pa != pb
        touching = np.zeros((k, k), dtype=bool)
        touching[pa[cross], pb[cross]] = True
        hop = _next_hop(touching, a, excess < 0)
        if hop is None:
            break
        on_boundary = cross & (pa == a) & (pb == hop)
        cells, faces = np.unique(src[on_boundary], return_counts=True)
        amount = int(excess[a]) if excess[hop] >= 0 else int(min(excess[a], -excess[hop]))
        take = cells[np.argsort(-faces, kind="stable")[:amount]]
        part[take] = hop
    raise UserError(
        "could not balance the partition to the target cell counts (disconnected mesh?); "
        "try --method concentric"
    )


def _next_hop(touching: NDArray[np.bool_], start: int, under: NDArray[np.bool_]) -> int | None:
    """First rank on a shortest path from ``start`` to any underfull rank."""
    first: dict[int, int] = {}
    queue: deque[int] = deque()
    for b in np.flatnonzero(touching[start]):
        first[int(b)] = int(b)
        queue.append(int(b))
    seen = {start, *first}
    while queue:
        r = queue.popleft()
        if under[r]:
            return first[r]
        for b in np.flatnonzero(touching[r]):
            if int(b) not in seen:
                seen.add(int(b))
                first[int(b)] = first[r]
                queue.append(int(b))
    return None


# --- concentric zones ---------------------------------------------------------------------


@dataclass(frozen=True)
class Zone:
    weight: float
    ranks: tuple[int, ...]
    """Ranks sharing this weight, in index order (= angular order of their sectors)."""


def zones(weights: list[float]) -> list[Zone]:
    """Distinct weights, heaviest first (innermost first)."""
    validate_weights(weights)
    by_weight: dict[float, list[int]] = {}
    for i, w in enumerate(weights):
        by_weight.setdefault(w, []).append(i)
    return [Zone(w, tuple(by_weight[w])) for w in sorted(by_weight, reverse=True)]


def concentric(
    centres: FloatArray,
    weights: list[float],
    center: FloatArray,
    axes: tuple[int, int] = (0, 1),
) -> IntArray:
    """Radial zones by distance from ``center`` (heaviest innermost), angular sectors in each.

    ``axes`` are the two coordinate axes in which sector angles are measured.
    """
    n = len(centres)
    targets = target_counts(weights, n)
    distance = np.linalg.norm(centres - center, axis=1)
    order = np.lexsort((np.arange(n), distance))  # ties: lower cell index first
    part = np.empty(n, dtype=np.int64)
    start = 0
    for zone in zones(weights):
        size = sum(targets[r] for r in zone.ranks)
        members = order[start : start + size]
        start += size
        if len(zone.ranks) == 1:
            part[members] = zone.ranks[0]
            continue
        rel = centres[members] - center
        angle = np.arctan2(rel[:, axes[1]], rel[:, axes[0]])
        by_angle = members[np.lexsort((members, angle))]
        s = 0
        for r in zone.ranks:
            part[by_angle[s : s + targets[r]]] = r
            s += targets[r]
    return part


def mean_distances(centres: FloatArray, center: FloatArray, part: IntArray, k: int) -> FloatArray:
    distance = np.linalg.norm(centres - center, axis=1)
    counts = np.bincount(part, minlength=k)
    sums = np.bincount(part, weights=distance, minlength=k)
    return np.divide(sums, counts, out=np.zeros(k), where=counts > 0)
