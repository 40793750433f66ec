"""Refined copies of a case: every blockMesh block's cell counts multiplied in x and y.

`rankpack demo` uses it to make a workload closer to a user's than the tutorial itself:
pitzDaily with its block cell counts doubled in x and y has 48 900 cells instead of 12 225,
so each rank's subdomain is large enough that computing, not MPI latency, dominates an
iteration (FACTS.md: co-location pays from that size on). The copy is built beside its
final place and renamed into it, meshed once, and reused while its blockMeshDict is the
same. Called by the CLI (`demo`).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from foamlib import FoamFile

from rankpack.case import openfoam
from rankpack.errors import UserError

MAX_REFINE = 8
"""A larger factor multiplies the cells by more than 64: minutes of meshing for a demo."""


def refined_blocks(blocks: list[Any], factor: int) -> list[Any]:
    """``blocks`` of a blockMeshDict (as foamlib reads it) with every ``hex``'s x and y cell
    counts multiplied by ``factor``; z (one cell in 2-D cases) is kept."""
    out: list[Any] = []
    i, found = 0, 0
    while i < len(blocks):
        item = blocks[i]
        if item == "hex" and i + 2 < len(blocks):
            counts = blocks[i + 2]
            if not (
                isinstance(counts, list)
                and len(counts) == 3
                and all(isinstance(c, int) and c > 0 for c in counts)
            ):
                raise UserError(
                    f"a blockMeshDict block has cell counts {counts!r}, not three numbers; "
                    "this case cannot be refined (use --refine 1)"
                )
            out += ["hex", blocks[i + 1], [counts[0] * factor, counts[1] * factor, counts[2]]]
            i += 3
            found += 1
            continue
        out.append(item)
        i += 1
    if not found:
        raise UserError("the blockMeshDict has no hex blocks to refine; use --refine 1")
    return out


def _blocks(case_dir: Path) -> tuple[FoamFile, list[Any]]:
    plain = case_dir / "system" / "blockMeshDict"
    path = plain if plain.is_file() else plain.with_name("blockMeshDict.gz")
    if not path.is_file():
        raise UserError(
            f"{case_dir.name} has no system/blockMeshDict, so its mesh cannot be refined; "
            "use --refine 1"
        )
    try:
        dictionary = FoamFile(path)
        blocks = dictionary["blocks"]
    except Exception as exc:  # foamlib's own parse errors; the file is the case's
        raise UserError(
            f"{path} cannot be read as a blockMeshDict ({type(exc).__name__}); use --refine 1"
        ) from None
    if not isinstance(blocks, list):
        raise UserError(f"{path} has no list of blocks; use --refine 1")
    return dictionary, blocks


def check_refinable(case_dir: Path, factor: int) -> None:
    """Can ``case_dir`` (a source case: only read) be refined by ``factor``? One line why
    not; nothing is created."""
    if not 1 <= factor <= MAX_REFINE:
        raise UserError(f"--refine must be between 1 and {MAX_REFINE}, got {factor}")
    if factor > 1:
        refined_blocks(_blocks(case_dir)[1], factor)


def refine_case(case_dir: Path, factor: int) -> None:
    """Edit ``case_dir``'s system/blockMeshDict in place (a copy's, never a source's)."""
    dictionary, blocks = _blocks(case_dir)
    dictionary["blocks"] = refined_blocks(blocks, factor)


def refined_case(case: str, factor: int, root: Path) -> Path:
    """A meshed copy of ``case`` (tutorial name or directory) refined by ``factor`` under
    ``root``; an existing complete copy is reused. The source is never modified."""
    source = openfoam.resolve_case(case)
    check_refinable(source.path, factor)
    final = root / f"{source.name}-x{factor}"
    if openfoam.has_mesh(final):
        return final
    staging = root / f".staging-{uuid.uuid4().hex[:8]}-{final.name}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        openfoam.copy_case(source, staging)
        refine_case(staging, factor)
        openfoam.ensure_mesh(staging)
        if final.exists():  # an incomplete copy (no mesh) from an interrupted attempt
            shutil.rmtree(final)
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final
