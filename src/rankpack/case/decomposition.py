"""Decompose an OpenFOAM case with cell counts that follow a weight vector.

Called by ``rankpack decompose`` and ``rankpack run --decompose``. The entry point is
`decompose_case`: read the mesh, partition it (`rankpack.case.partition`), write
``system/decomposeParDict`` (``method manual``) and ``constant/cellDecomposition``, run
``decomposePar`` and check that OpenFOAM counted the same cells per processor.

Everything that can be checked is checked before a file is written. ``decomposePar`` then
runs in a staging copy of the case (``.rankpack-decompose-<pid>-<token>/`` inside it,
hard links to the mesh, fresh copies of what is written), and only a complete result is
moved into place: the new ``processor*`` directories, decomposeParDict, cellDecomposition
and log replace the old ones by renames, with SIGINT/SIGTERM held off for those few
renames. Any failure or interruption before that leaves the case untouched and removes the
staging copy. After a SIGKILL the staging copy is a hidden directory named with the dead
process's pid, removed by the next decomposition of that case (`clean_stale`).

`write_processor_weights` is the other route, for OpenFOAM builds with a working Scotch:
``method scotch; scotchCoeffs { processorWeights (...); }``, decomposed by OpenFOAM itself.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rankpack._proc import alive
from rankpack.case import partition
from rankpack.case.mesh import (
    FloatArray,
    IntArray,
    PolyMesh,
    bounds,
    cell_centres,
    cell_graph,
    plane_axes,
    read_polymesh,
    wall_bounds,
)
from rankpack.case.openfoam import COPY_SKIPS, keep_log
from rankpack.case.openfoam import decompose as openfoam_decompose
from rankpack.case.partition import Method
from rankpack.errors import UserError
from rankpack.quantities import literal

DICT_PATH = Path("system") / "decomposeParDict"
DATA_FILE = "cellDecomposition"
DATA_PATH = Path("constant") / DATA_FILE
_HEADER = (
    "FoamFile\n{{\n    version     2.0;\n    format      ascii;\n    class       {cls};\n"
    '    location    "{loc}";\n    object      {obj};\n}}\n'
    "// written by rankpack\n\n"
)


@dataclass(frozen=True)
class RankCells:
    """One rank's share of a decomposition."""

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
    ranks: tuple[RankCells, ...]
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
    if len(values) != 3 or not all(math.isfinite(v) and abs(v) <= 1e15 for v in values):
        raise UserError(
            f"--center {literal(text)} is not a point; give X,Y,Z such as 0.5,0,0 "
            "(finite, |v| <= 1e15)"
        )
    return values[0], values[1], values[2]


def parse_method(method: Method | str) -> Method:
    """A decomposition method by its value (equal | weighted | concentric)."""
    try:
        return Method(method)
    except ValueError:
        raise UserError(
            f"unknown method '{method}'; use {', '.join(m.value for m in Method)}"
        ) from None


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
    method = parse_method(method)
    weights = resolve_weights(method, n_ranks, weights)
    if vertex_weights is not None and method is not Method.WEIGHTED:
        raise UserError("vertex weights are only used by --method weighted")
    mesh = read_polymesh(case_dir)
    targets = partition.target_counts(weights, mesh.n_cells)
    if vertex_weights is not None and len(vertex_weights) != mesh.n_cells:
        raise UserError(f"{len(vertex_weights)} vertex weights for {mesh.n_cells} cells")
    centres = cell_centres(mesh)
    plane = plane_axes(mesh.points)
    point, source, warnings = _choose_centre(mesh, center)
    t_read = time.perf_counter()

    if method is Method.CONCENTRIC:
        assignment = partition.concentric(centres, weights, point, plane)
    else:
        assignment = partition.weighted(cell_graph(mesh), weights, vertex_weights=vertex_weights)
    counts = _cells_per_rank(assignment, n_ranks, mesh.n_cells)
    means = partition.mean_distances(centres, point, assignment, n_ranks)
    cut = partition.edge_cut(mesh.owner, mesh.neighbour, assignment)
    t_part = time.perf_counter()

    openfoam_cells, t_write = _write_and_decompose(
        case_dir, assignment, counts.tolist(), run_decompose_par=run_decompose_par
    )
    t_end = time.perf_counter()

    return DecompositionResult(
        case_dir=case_dir,
        method=method,
        n_cells=mesh.n_cells,
        ranks=_rank_cells(weights, targets, counts, means),
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


def _cells_per_rank(assignment: IntArray, n_ranks: int, n_cells: int) -> IntArray:
    counts: IntArray = np.bincount(assignment, minlength=n_ranks)
    if counts.sum() != n_cells or len(counts) != n_ranks:
        raise AssertionError("partition lost or invented cells")  # a bug, not user input
    return counts


def _rank_cells(
    weights: list[float], targets: list[int], counts: IntArray, means: FloatArray
) -> tuple[RankCells, ...]:
    return tuple(
        RankCells(
            rank=i,
            weight=weights[i],
            target_cells=targets[i],
            cells=int(counts[i]),
            mean_distance=float(means[i]),
        )
        for i in range(len(weights))
    )


def _choose_centre(
    mesh: PolyMesh, center: tuple[float, float, float] | None
) -> tuple[FloatArray, str, list[str]]:
    """The decomposition centre, how it was chosen, and a warning if a given one lies
    outside the mesh's bounding box."""
    warnings: list[str] = []
    lo, hi = bounds(mesh.points)
    if center is not None:
        point = np.asarray(center, dtype=np.float64)
        if np.any(point < lo) or np.any(point > hi):
            warnings.append(
                f"centre {_fmt(point)} is outside the mesh bounding box "
                f"{_fmt(lo)}..{_fmt(hi)}; zones will be off-centre"
            )
        return point, "given", warnings
    walls = wall_bounds(mesh)
    if walls is not None:
        return (walls[0] + walls[1]) / 2, "wall patches", warnings
    return (lo + hi) / 2, "mesh bounding box", warnings


def _write_and_decompose(
    case_dir: Path, assignment: IntArray, counts: list[int], *, run_decompose_par: bool
) -> tuple[tuple[int, ...] | None, float]:
    """Write the manual decomposition; with ``run_decompose_par``, run decomposePar in a
    staging copy, check its counts against ``counts`` and install the result.

    Returns decomposePar's cells per processor (None if it did not run) and the
    `time.perf_counter` at which the files were written.
    """
    n_ranks = len(counts)
    if not run_decompose_par:
        write_manual_dict(case_dir, n_ranks)
        write_cell_decomposition(case_dir, assignment)
        return None, time.perf_counter()
    with staged(case_dir) as stage:
        write_manual_dict(stage, n_ranks)
        write_cell_decomposition(stage, assignment)
        t_write = time.perf_counter()
        openfoam_cells = tuple(openfoam_decompose(stage))
        if list(openfoam_cells) != counts:
            log = stage / "log.decomposePar"
            where = keep_log(log, case_dir.name) if log.is_file() else log
            raise UserError(
                f"decomposePar counted {list(openfoam_cells)} cells per processor, "
                f"rankpack assigned {counts}; see {where}"
            )
        install(stage, case_dir, [DICT_PATH, DATA_PATH])
    return openfoam_cells, t_write


def _fmt(p: FloatArray) -> str:
    return "(" + " ".join(f"{float(v):.4g}" for v in p) + ")"


def write_manual_dict(case_dir: Path, n_ranks: int) -> None:
    text = _HEADER.format(cls="dictionary", loc="system", obj="decomposeParDict") + (
        f"numberOfSubdomains {n_ranks};\n\nmethod          manual;\n\n"
        f'manualCoeffs\n{{\n    dataFile    "{DATA_FILE}";\n}}\n'
    )
    _write_atomic(case_dir / DICT_PATH, text)


def write_cell_decomposition(case_dir: Path, assignment: IntArray) -> None:
    """The labelList decomposePar's manual method reads from constant/ (v1912 and later)."""
    body = "\n".join(map(str, assignment.tolist()))
    text = _HEADER.format(cls="labelList", loc="constant", obj=DATA_FILE) + (
        f"{len(assignment)}\n(\n{body}\n)\n"
    )
    _write_atomic(case_dir / DATA_PATH, text)


def write_scotch_dict(case_dir: Path, weights: list[float]) -> None:
    wtext = " ".join(f"{w:g}" for w in weights)
    text = _HEADER.format(cls="dictionary", loc="system", obj="decomposeParDict") + (
        f"numberOfSubdomains {len(weights)};\n\nmethod          scotch;\n\n"
        f"scotchCoeffs\n{{\n    processorWeights ({wtext});\n}}\n"
    )
    _write_atomic(case_dir / DICT_PATH, text)


def _write_atomic(path: Path, text: str) -> None:
    """Write beside, then rename: a reader never sees half a file, and a hard link to the
    old file (a staging copy's source) is never written through."""
    tmp = path.with_name(f".{path.name}.rankpack-tmp-{os.getpid()}-{secrets.token_hex(3)}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
    write_scotch_dict(case_dir, weights)
    if not run_decompose_par:
        return ProcessorWeightsResult(
            case_dir, tuple(weights), None, f"wrote {case_dir / DICT_PATH} (method scotch)"
        )
    log_text = ""
    try:
        with staged(case_dir) as stage:
            try:
                counts = openfoam_decompose(stage)
            finally:
                log_path = stage / "log.decomposePar"
                log_text = log_path.read_text(errors="replace") if log_path.is_file() else ""
            install(stage, case_dir, [])
    except UserError as exc:
        log = log_text
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


STAGING_PREFIX = ".rankpack-decompose-"
_OURS = re.compile(r"rankpack-(?:decompose|old|tmp)-(\d+)-[0-9a-f]+$")
LEGACY_STASH = ".rankpack-stash"


def clean_stale(directory: Path) -> list[Path]:
    """Remove staging copies and temporaries that a killed rankpack left in ``directory``
    (hidden entries named with a pid that no longer exists); return what was removed.

    A ``.rankpack-stash`` from rankpack versions before the staged decomposition holds the
    case's previous ``processor*`` directories: they are moved back if the case has none.
    """
    removed: list[Path] = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = _OURS.search(entry.name)
        if not entry.name.startswith(".") or m is None or alive(int(m.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    stash = directory / LEGACY_STASH
    if stash.is_dir():
        if not any(directory.glob("processor*")):
            for proc in stash.glob("processor*"):
                proc.rename(directory / proc.name)
        shutil.rmtree(stash, ignore_errors=True)
        removed.append(stash)
    return removed


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


@contextmanager
def staged(case_dir: Path) -> Iterator[Path]:
    """A staging copy of ``case_dir`` inside it (hard links where possible, without
    ``processor*``, logs or other staging copies), removed on exit whatever happens.

    Files are hard-linked, so whatever is written in the copy must be replaced (written
    beside and renamed, as `_write_atomic` does), never written through.
    """
    clean_stale(case_dir)
    stage = case_dir / f"{STAGING_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    stage.mkdir()
    try:
        for entry in sorted(case_dir.iterdir()):
            if entry.name.startswith(COPY_SKIPS) or entry == stage:
                continue
            if entry.is_dir():
                shutil.copytree(entry, stage / entry.name, copy_function=_link_or_copy)
            else:
                _link_or_copy(str(entry), str(stage / entry.name))
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def install(stage: Path, case_dir: Path, files: list[Path]) -> None:
    """Move a finished decomposition from ``stage`` into ``case_dir``: ``processor*``
    directories (the old ones go), ``files`` and log.decomposePar, by renames only.

    SIGINT and SIGTERM are held off meanwhile, so an interrupted command leaves either the
    old decomposition or the new one.
    """
    blocked = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        old = case_dir / f".rankpack-old-{os.getpid()}-{secrets.token_hex(4)}"
        old.mkdir()
        for proc in sorted(case_dir.glob("processor*")):
            if proc.is_dir():
                proc.rename(old / proc.name)
        for proc in sorted(stage.glob("processor*")):
            proc.rename(case_dir / proc.name)
        for rel in [*files, Path("log.decomposePar")]:
            if (stage / rel).exists():
                os.replace(stage / rel, case_dir / rel)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
