"""`rankpack decompose`: split a case's mesh into ranks whose cell counts follow weights.

A case directory is decomposed in place; a tutorial name is first copied into --output
and meshed. The work is done by `rankpack.case.decomposition`.

Atomic: a tutorial is copied, meshed and decomposed in a hidden temporary directory next
to --output (``.<name>.rankpack-tmp-<pid>-<token>``) that is renamed to --output only when
everything (plot included) succeeded; a case directory is decomposed in a staging copy and
the result moved in by renames (see `rankpack.case.decomposition`). Every output path is
checked while the arguments are parsed, before the case is touched.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import shutil
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rankpack.case.decomposition import (
    DecompositionResult,
    clean_stale,
    decompose_case,
    parse_center,
    write_processor_weights,
)
from rankpack.case.openfoam import copy_case, ensure_mesh, resolve_case
from rankpack.case.partition import Method
from rankpack.cli.common import (
    parse_list,
    parse_new_dir,
    parse_output_file,
    parse_ranks,
    print_json,
)
from rankpack.errors import UserError
from rankpack.plan.allocation import parse_weights


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "decompose",
        help="decompose a case so cells per rank follow weights (method manual)",
        description=(
            "Partition the mesh of CASE into ranks whose cell counts follow --weights, "
            "write system/decomposeParDict (method manual) and constant/cellDecomposition, "
            "and run decomposePar. CASE is a case directory (decomposed in place) or a "
            "tutorial name (copied into --output and meshed first)."
        ),
    )
    p.add_argument("case", metavar="CASE", help="case directory or tutorial name")
    p.add_argument("--ranks", type=parse_ranks, help="number of ranks (default: number of weights)")
    p.add_argument(
        "--method",
        choices=[m.value for m in Method],
        help=(
            "equal: METIS, equal cells; weighted: METIS with target fractions = weights; "
            "concentric: radial zones by distance from --center, heaviest weight innermost "
            "(default: weighted if --weights is given, else equal)"
        ),
    )
    p.add_argument(
        "--weights", type=parse_list, help="per-rank weights: 1,1,5,15 or grouped 8x1,4x5,4x15"
    )
    p.add_argument(
        "--center",
        metavar="X,Y,Z",
        help="centre for concentric zones and mean distances "
        "(default: centre of the wall patches, else of the mesh)",
    )
    p.add_argument(
        "--output",
        metavar="DIR",
        type=parse_new_dir,
        help="where to copy a tutorial case (new directory)",
    )
    p.add_argument(
        "--plot", metavar="PNG", type=parse_output_file, help="draw cell centres coloured by rank"
    )
    p.add_argument(
        "--write-processor-weights",
        action="store_true",
        help="instead write method scotch with processorWeights (for an OpenFOAM with Scotch)",
    )
    p.add_argument(
        "--no-decompose-par",
        action="store_true",
        help="write the files but do not run decomposePar",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=handle)


def _weights_and_method(args: argparse.Namespace) -> tuple[Method, int, list[float] | None]:
    weights = parse_weights(args.weights) if args.weights is not None else None
    method = Method(args.method) if args.method else (Method.WEIGHTED if weights else Method.EQUAL)
    if method is Method.EQUAL and weights is not None:
        raise UserError(
            "--method equal splits cells equally; drop --weights or use --method weighted"
        )
    if method is not Method.EQUAL and weights is None:
        raise UserError(f"--method {method.value} needs --weights, e.g. --weights 4,3,2,1")
    ranks = args.ranks if args.ranks is not None else (len(weights) if weights else None)
    if ranks is None:
        raise UserError("give --ranks N (or --weights, one per rank)")
    if ranks < 1:
        raise UserError(f"--ranks must be at least 1, got {ranks}")
    if weights is not None and len(weights) != ranks:
        raise UserError(
            f"--weights has {len(weights)} values but --ranks is {ranks}; give one weight per rank"
        )
    return method, ranks, weights


def _check_case(args: argparse.Namespace) -> Path | None:
    """Validate CASE and --output before anything is written; the --output path for a
    tutorial (None for a case directory, which is decomposed in place)."""
    source = resolve_case(args.case, require_solver=False)
    if not source.tutorial:
        if args.output:
            raise UserError(
                "--output is only for a tutorial name; a case directory is decomposed in place"
            )
        return None
    if not args.output:
        raise UserError(
            f"{args.case} is a tutorial; give --output DIR to copy it there (it is not "
            "decomposed in the installed examples)"
        )
    dest: Path = args.output
    if os.path.lexists(dest):
        raise UserError(f"--output {dest} already exists; give a new directory")
    return dest


def _case_dir(args: argparse.Namespace, dest: Path | None) -> tuple[Path, bool]:
    """The case to work on, and whether it is a temporary tutorial copy of this command
    (to be renamed to ``dest`` by `_publish`)."""
    source = resolve_case(args.case, require_solver=False)
    if dest is None:
        return source.path, False
    clean_stale(dest.parent)
    tmp = dest.parent / f".{dest.name[:100]}.rankpack-tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        copy_case(source, tmp)
        ensure_mesh(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp, True


def _publish(tmp: Path, dest: Path) -> Path:
    """Rename the finished temporary copy to --output (never over an existing path)."""
    if os.path.lexists(dest):
        raise UserError(f"--output {dest} was created meanwhile by someone else; not replaced")
    tmp.rename(dest)
    return dest.resolve()


def handle(args: argparse.Namespace) -> int:
    method, ranks, weights = _weights_and_method(args)
    center = parse_center(args.center) if args.center else None
    plot: Path | None = args.plot
    dest = _check_case(args)
    if args.write_processor_weights:
        if method is Method.CONCENTRIC:
            raise UserError(
                "--write-processor-weights writes a Scotch dict; Scotch cannot make "
                "concentric zones (use --method weighted)"
            )
        if plot is not None:
            raise UserError("--plot needs rankpack's own partition; drop --write-processor-weights")
        case_dir, created = _case_dir(args, dest)
        try:
            pw = write_processor_weights(
                case_dir, weights or [1.0] * ranks, run_decompose_par=not args.no_decompose_par
            )
            if created and dest is not None:
                final = _publish(case_dir, dest)
                pw = dataclasses.replace(
                    pw, case_dir=final, message=pw.message.replace(str(case_dir), str(final))
                )
                case_dir = final
        except BaseException:
            if created:
                shutil.rmtree(case_dir, ignore_errors=True)
            raise
        if args.json:
            print_json(
                {
                    "method": "scotch",
                    "case": str(case_dir),
                    "processor_weights": list(pw.weights),
                    "openfoam_cells": (
                        None if pw.openfoam_cells is None else list(pw.openfoam_cells)
                    ),
                    "message": pw.message,
                }
            )
        else:
            print(pw.message)
        return 0

    case_dir, created = _case_dir(args, dest)
    try:
        result = decompose_case(
            case_dir,
            ranks,
            method,
            weights,
            center,
            run_decompose_par=not args.no_decompose_par,
        )
        if plot is not None:
            from rankpack.case.decomp_plot import plot_decomposition

            plot_decomposition(result, plot)
        if created and dest is not None:
            result = dataclasses.replace(result, case_dir=_publish(case_dir, dest))
    except BaseException:
        if created:  # a tutorial copy this command made: do not leave it half-decomposed
            shutil.rmtree(case_dir, ignore_errors=True)
        raise
    for line in result.warnings:
        print(f"rankpack: warning: {line}", file=sys.stderr)
    if args.json:
        print_json(result.to_json())
    else:
        _print_table(result, plot)
    return 0


def _print_table(result: DecompositionResult, plot: Path | None) -> None:
    counted = "decomposePar" if result.openfoam_cells is not None else "rankpack (not decomposed)"
    table = Table(
        title=(
            f"{result.method.value} decomposition of {result.case_dir} "
            f"({result.n_cells} cells, cells as counted by {counted})"
        )
    )
    for col in ("rank", "weight", "target", "cells", "share", "mean distance"):
        table.add_column(col, justify="right")
    for r in result.ranks:
        table.add_row(
            str(r.rank),
            f"{r.weight:g}",
            str(r.target_cells),
            str(r.cells),
            f"{100 * r.cells / result.n_cells:.1f}%",
            f"{r.mean_distance:.4g}",
        )
    console = Console()
    console.print(table)
    c = ", ".join(f"{v:.4g}" for v in result.center)
    console.print(f"edge cut: {result.edge_cut} internal faces between ranks")
    console.print(f"centre: ({c}) from {result.center_source}")
    console.print(
        f"wrote system/decomposeParDict and constant/cellDecomposition in {result.case_dir}"
    )
    if plot is not None:
        console.print(f"plot: {plot}")
