"""Decompose an OpenFOAM case with cell counts that follow a weight vector.

Called by ``rankpack decompose`` and ``rankpack run --decompose``. The entry point is
`decompose_case`: read the mesh, partition it (`rankpack.case.partition`), write
``system/decomposeParDict`` (``method manual``) and ``constant/cellDecomposition``, run
``decomposePar`` and check that OpenFOAM counted the same cells per processor.

Everything that can be checked is checked before a file is written. If a later step
fails, the case is put back as it was: the previous decomposeParDict and
cellDecomposition are restored and earlier ``processor*`` directories (which
``decomposePar -force`` deletes first) are moved back.

`write_processor_weights` is the other route, for OpenFOAM builds with a working Scotch:
``method scotch; scotchCoeffs { processorWeights (...); }``, decomposed by OpenFOAM itself.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rankpack.case import partition
from rankpack.case.mesh import (
    FloatArray,
    IntArray,
    bounds,
    cell_centres,
    cell_graph,
    plane_axes,
    read_polymesh,
    wall_bounds,
)
from rankpack.case.openfoam import decompose as openfoam_decompose
from rankpack.case.partition import Method
from rankpack.errors import UserError

DICT_PATH = Path("system") / "decomposeParDict"
DATA_FILE = "cellDecomposition"
DATA_PATH = Path("constant") / DATA_FILE
_HEADER = (
    "FoamFile\n{{\n    version     2.0;\n    format      ascii;\n    class       {cls};\n"
    '    location    "{loc}";\n    object      {obj};\n}}\n'
    "// written by rankpack\n\n"
)


@dataclass(frozen=True)
class RankResult:
    rank: int
    weight: float
    target_cells: int
    cells: int
    mean_distance: float
    """Mean distance of the rank's cell centres from the decomposition centre (mesh units)."""


@dataclass(frozen=True)
class DecompositionResult:
    case_dir: Path
    method: Method
    n_cells: int
    ranks: tuple[RankResult, ...]
    edge_cut: int
    """Internal faces between cells on different ranks."""
    center: tuple[float, float, float]
    center_source: str
    """How the centre was chosen: 'given', 'wall patches' or 'mesh bounding box'."""
    openfoam_cells: tuple[int, ...] | None
    """Cells per processor as decomposePar reported them; None if it was not run."""
    assignment: IntArray = field(repr=False)
    centres: FloatArray = field(repr=False)
    plane: tuple[int, int] = (0, 1)
    """The two coordinate axes of the mesh plane (largest extent), used for sectors and plots."""
    warnings: tuple[str, ...] = ()
    timings_s: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "method": self.method.value,
            "case": str(self.case_dir),
            "n_cells": self.n_cells,
            "center": list(self.center),
            "center_source": self.center_source,
            "ranks": [
                {
                    "rank": r.rank,
                    "weight": r.weight,
                    "target_cells": r.target_cells,
                    "cells": r.cells,
                    "mean_distance": r.mean_distance,
                }
                for r in self.ranks
            ],
            "edge_cut": self.edge_cut,
            "decompose_par": self.openfoam_cells is not None,
            "warnings": list(self.warnings),
            "timings_s": {k: round(v, 4) for k, v in self.timings_s.items()},
        }


def parse_center(text: str) -> tuple[float, float, float]:
    """'X,Y,Z' (also with spaces or parentheses) -> a point."""
    parts = text.strip().strip("()").replace(",", " ").split()
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise UserError(f"--center '{text}' is not a point; give X,Y,Z such as 0.5,0,0")
    return values[0], values[1], values[2]


def resolve_weights(method: Method, n_ranks: int, weights: list[float] | None) -> list[float]:
    """Weights for the method: ignored (all 1) for equal, else one positive value per rank."""
    if n_ranks < 1:
        raise UserError(f"--ranks must be at least 1, got {n_ranks}")
    if method is Method.EQUAL or weights is None:
        if method is not Method.EQUAL:
            raise UserError(f"--method {method.value} needs --weights (one per rank)")
        return [1.0] * n_ranks
    if len(weights) != n_ranks:
        raise UserError(f"{len(weights)} weights for {n_ranks} ranks; give one weight per rank")
    partition.validate_weights(weights)
    return list(weights)


def decompose_case(
    case_dir: Path,
    n_ranks: int,
    method: Method | str,
    weights: list[float] | None = None,
    center: tuple[float, float, float] | None = None,
    *,
    vertex_weights: IntArray | None = None,
    run_decompose_par: bool = True,
) -> DecompositionResult:
    """Partition the case's mesh into ``n_ranks`` with cells ∝ ``weights`` and decompose it.

    ``method``: equal | weighted | concentric. ``weights`` is ignored for equal.
    ``center`` is used by concentric and for the reported mean distances; default: the
    centre of the wall patches' bounding box, else of the mesh's. ``vertex_weights``
    (weighted only) are per-cell costs METIS balances instead of cell counts.
    Writes ``system/decomposeParDict`` and ``constant/cellDecomposition`` and runs
    ``decomposePar`` unless ``run_decompose_par`` is False. Raises UserError on bad
    input, leaving the case unchanged.
    """
    t0 = time.perf_counter()
    try:
        method = Method(method)
    except ValueError:
        raise UserError(
            f"unknown method '{method}'; use {', '.join(m.value for m in Method)}"
        ) from None
    weights = resolve_weights(method, n_ranks, weights)
    if vertex_weights is not None and method is not Method.WEIGHTED:
        raise UserError("vertex weights are only used by --method weighted")
    mesh = read_polymesh(case_dir)
    targets = partition.target_counts(weights, mesh.n_cells)
    if vertex_weights is not None and len(vertex_weights) != mesh.n_cells:
        raise UserError(f"{len(vertex_weights)} vertex weights for {mesh.n_cells} cells")
    centres = cell_centres(mesh)
    plane = plane_axes(mesh.points)
    warnings: list[str] = []
    lo, hi = bounds(mesh.points)
    if center is not None:
        point = np.asarray(center, dtype=np.float64)
        source = "given"
        if np.any(point < lo) or np.any(point > hi):
            warnings.append(
                f"centre {_fmt(point)} is outside the mesh bounding box "
                f"{_fmt(lo)}..{_fmt(hi)}; zones will be off-centre"
            )
    else:
        walls = wall_bounds(mesh)
        if walls is not None:
            point, source = (walls[0] + walls[1]) / 2, "wall patches"
        else:
            point, source = (lo + hi) / 2, "mesh bounding box"
    t_read = time.perf_counter()

    if method is Method.CONCENTRIC:
        assignment = partition.concentric(centres, weights, point, plane)
    else:
        assignment = partition.weighted(cell_graph(mesh), weights, vertex_weights=vertex_weights)
    counts = np.bincount(assignment, minlength=n_ranks)
    if counts.sum() != mesh.n_cells or len(counts) != n_ranks:
        raise AssertionError("partition lost or invented cells")  # a bug, not user input
    means = partition.mean_distances(centres, point, assignment, n_ranks)
    cut = partition.edge_cut(mesh.owner, mesh.neighbour, assignment)
    t_part = time.perf_counter()

    openfoam_cells: tuple[int, ...] | None = None
    with _restorable(case_dir, [DICT_PATH, DATA_PATH], processors=run_decompose_par) as commit:
        write_manual_dict(case_dir, n_ranks)
        write_cell_decomposition(case_dir, assignment)
        t_write = time.perf_counter()
        if run_decompose_par:
            openfoam_cells = tuple(openfoam_decompose(case_dir))
            if list(openfoam_cells) != counts.tolist():
                raise UserError(
                    f"decomposePar counted {list(openfoam_cells)} cells per processor, "
                    f"rankpack assigned {counts.tolist()}; see {case_dir}/log.decomposePar"
                )
        commit()
    t_end = time.perf_counter()

    ranks = tuple(
        RankResult(
            rank=i,
            weight=weights[i],
            target_cells=targets[i],
            cells=int(counts[i]),
            mean_distance=float(means[i]),
        )
        for i in range(n_ranks)
    )
    return DecompositionResult(
        case_dir=case_dir,
        method=method,
        n_cells=mesh.n_cells,
        ranks=ranks,
        edge_cut=cut,
        center=(float(point[0]), float(point[1]), float(point[2])),
        center_source=source,
        openfoam_cells=openfoam_cells,
        assignment=assignment,
        centres=centres,
        plane=plane,
        warnings=tuple(warnings),
        timings_s={
            "read_mesh": t_read - t0,
            "partition": t_part - t_read,
            "write": t_write - t_part,
            "decompose_par": t_end - t_write if run_decompose_par else 0.0,
        },
    )


def _fmt(p: FloatArray) -> str:
    return "(" + " ".join(f"{float(v):.4g}" for v in p) + ")"


def write_manual_dict(case_dir: Path, n_ranks: int) -> None:
    text = _HEADER.format(cls="dictionary", loc="system", obj="decomposeParDict") + (
        f"numberOfSubdomains {n_ranks};\n\nmethod          manual;\n\n"
        f'manualCoeffs\n{{\n    dataFile    "{DATA_FILE}";\n}}\n'
    )
    (case_dir / DICT_PATH).write_text(text)


def write_cell_decomposition(case_dir: Path, assignment: IntArray) -> None:
    """The labelList decomposePar's manual method reads from constant/ (v1912 and later)."""
    body = "\n".join(map(str, assignment.tolist()))
    text = _HEADER.format(cls="labelList", loc="constant", obj=DATA_FILE) + (
        f"{len(assignment)}\n(\n{body}\n)\n"
    )
    (case_dir / DATA_PATH).write_text(text)


def write_scotch_dict(case_dir: Path, weights: list[float]) -> None:
    wtext = " ".join(f"{w:g}" for w in weights)
    text = _HEADER.format(cls="dictionary", loc="system", obj="decomposeParDict") + (
        f"numberOfSubdomains {len(weights)};\n\nmethod          scotch;\n\n"
        f"scotchCoeffs\n{{\n    processorWeights ({wtext});\n}}\n"
    )
    (case_dir / DICT_PATH).write_text(text)


@dataclass(frozen=True)
class ProcessorWeightsResult:
    case_dir: Path
    weights: tuple[float, ...]
    openfoam_cells: tuple[int, ...] | None
    """Cells per processor from decomposePar, or None if it did not run or failed."""
    message: str


def write_processor_weights(
    case_dir: Path, weights: list[float], *, run_decompose_par: bool = True
) -> ProcessorWeightsResult:
    """Write a Scotch decomposeParDict with ``processorWeights`` and try decomposePar.

    The dict is the product: it is kept even when this machine's Scotch is a stub (Debian's
    OpenFOAM), in which case the result says so and no processor directories are changed.
    """
    partition.validate_weights(weights)
    if not (case_dir / "system").is_dir():
        raise UserError(f"{case_dir} has no system/ directory; give an OpenFOAM case")
    if run_decompose_par:
        mesh = read_polymesh(case_dir)
        partition.target_counts(weights, mesh.n_cells)
    with _restorable(case_dir, [DICT_PATH], processors=False) as commit:
        write_scotch_dict(case_dir, weights)
        commit()
    if not run_decompose_par:
        return ProcessorWeightsResult(
            case_dir, tuple(weights), None, f"wrote {case_dir / DICT_PATH} (method scotch)"
        )
    try:
        with _restorable(case_dir, []) as commit_processors:
            counts = openfoam_decompose(case_dir)
            commit_processors()
    except UserError as exc:
        log = (case_dir / "log.decomposePar").read_text(errors="replace")
        why = (
            "this OpenFOAM's Scotch library is a stub"
            if "dummy" in log or "without the scotchDecomp" in log
            else f"decomposePar failed ({exc})"
        )
        return ProcessorWeightsResult(
            case_dir,
            tuple(weights),
            None,
            f"wrote {case_dir / DICT_PATH} (method scotch, processorWeights); not decomposed "
            f"here: {why}; run decomposePar with an OpenFOAM build that has Scotch",
        )
    return ProcessorWeightsResult(
        case_dir, tuple(weights), tuple(counts), "decomposed by Scotch with processorWeights"
    )


@contextmanager
def _restorable(
    case_dir: Path, files: list[Path], *, processors: bool = True
) -> Iterator[Callable[[], None]]:
    """Put ``files`` (and ``processor*`` dirs) back as they were unless ``commit()`` is called."""
    saved: dict[Path, bytes | None] = {}
    for rel in files:
        path = case_dir / rel
        saved[path] = path.read_bytes() if path.is_file() else None
    stash = case_dir / ".rankpack-stash"
    moved: list[Path] = []
    if stash.exists():
        shutil.rmtree(stash)
    for proc in sorted(case_dir.glob("processor*")) if processors else []:
        if proc.is_dir():
            stash.mkdir(exist_ok=True)
            proc.rename(stash / proc.name)
            moved.append(proc)
    done = False

    def commit() -> None:
        nonlocal done
        done = True

    try:
        yield commit
    finally:
        if done:
            if stash.exists():
                shutil.rmtree(stash)
        else:
            for path, content in saved.items():
                if content is None:
                    path.unlink(missing_ok=True)
                else:
                    path.write_bytes(content)
            for proc in case_dir.glob("processor*") if processors else []:
                if proc.is_dir():
                    shutil.rmtree(proc)
            for proc in moved:
                (stash / proc.name).rename(proc)
            if stash.exists():
                shutil.rmtree(stash)
