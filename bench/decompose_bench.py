"""Decomposition benchmark: time rankpack's decomposition on pitzDaily, aerofoilNACA0012 and a
~500k-cell refined aerofoilNACA0012 (the tutorial's blockMeshDict cell counts scaled by 5.6
in each in-plane direction, as seed 001 scaled them for its 498 834-cell mesh).

    .venv/bin/python bench/decompose_bench.py [--repeat 3] [--workdir DIR] [--cases ...]

Prints a Markdown table (medians over --repeat runs) for docs/benchmarks.md. Each run
reads the mesh, computes cell centres, partitions, writes cellDecomposition and runs
decomposePar; the columns split that time.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import tempfile
import time
from pathlib import Path

from rankpack.case.decomposition import decompose_case
from rankpack.case.openfoam import copy_case, ensure_mesh, find_tutorial, n_cells, resolve_case

SCALE = 5.6
RUNS = [
    ("weighted", [1.0, 1.0, 5.0, 15.0]),
    ("concentric", [4.0, 3.0, 2.0, 1.0]),
    ("concentric", [1.0] * 8 + [5.0] * 4 + [15.0] * 4),
]


def refine_aerofoil(case: Path, scale: float) -> None:
    """Scale zCells, xUCells, xMCells, xDCells in system/blockMeshDict."""
    path = case / "system" / "blockMeshDict"
    text = path.read_text()
    for key in ("zCells", "xUCells", "xMCells", "xDCells"):
        text = re.sub(
            rf"(\b{key}\s+)(\d+)", lambda m: f"{m.group(1)}{round(int(m.group(2)) * scale)}", text
        )
    path.write_text(text)


def prepare(name: str, workdir: Path) -> Path:
    dest = workdir / name
    if (dest / "constant" / "polyMesh" / "owner").is_file():
        return dest
    tutorial = "aerofoilNACA0012" if name.startswith("aerofoil") else name
    source = resolve_case(str(find_tutorial(tutorial)))
    copy_case(source, dest)
    if name == "aerofoilNACA0012-500k":
        refine_aerofoil(dest, SCALE)
    t = time.perf_counter()
    ensure_mesh(dest)
    print(f"# meshed {name}: {n_cells(dest)} cells in {time.perf_counter() - t:.1f} s")
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--cases",
        nargs="+",
        default=["pitzDaily", "aerofoilNACA0012", "aerofoilNACA0012-500k"],
    )
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rankpack-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.cases:
        case = prepare(name, workdir)
        for method, weights in RUNS:
            samples: dict[str, list[float]] = {}
            cut = 0
            for _ in range(args.repeat):
                t = time.perf_counter()
                cpu = time.process_time()  # this process only: excludes decomposePar
                result = decompose_case(case, len(weights), method, weights)
                total = time.perf_counter() - t
                cpu = time.process_time() - cpu
                for key, value in {**result.timings_s, "total": total, "cpu": cpu}.items():
                    samples.setdefault(key, []).append(value)
                cut = result.edge_cut
            med = {k: statistics.median(v) for k, v in samples.items()}
            label = f"{method} {len(weights)}"
            rows.append((name, result.n_cells, label, med, cut))
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}; "
        f"medians of {args.repeat} runs, seconds\n"
    )
    print(
        "| case | cells | method, ranks | read mesh + centres | partition | write | "
        "decomposePar | total | rankpack CPU | edge cut |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, cells, label, med, cut in rows:
        print(
            f"| {name} | {cells} | {label} | {med['read_mesh']:.2f} | {med['partition']:.2f} | "
            f"{med['write']:.2f} | {med['decompose_par']:.2f} | {med['total']:.2f} | "
            f"{med['cpu']:.2f} | {cut} |"
        )


if __name__ == "__main__":
    main()
