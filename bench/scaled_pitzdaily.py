#!/usr/bin/env python3
"""Write pitzDaily (Debian openfoam-examples) with its block cell counts scaled in x and y.

  python3 bench/scaled_pitzdaily.py DIR [--scale 2]

Scale 2 gives 48 900 cells (4 x 12 225), the "scaled pitzDaily" of FACTS.md and issue 13:
subdomains of tens of thousands of cells per rank, like users' runs. DIR must not exist;
the case is meshed by rankpack when it is staged (blockMesh), as any tutorial.
"""

from __future__ import annotations

import argparse
import gzip
import re
import shutil
import sys
from pathlib import Path

TUTORIAL = Path("/usr/share/doc/openfoam-examples/examples/incompressible/simpleFoam/pitzDaily")
CELLS = re.compile(r"(hex\s*\([^)]*\)\s*)\((\d+) (\d+) (\d+)\)")
"""A block: its vertices, then its cell counts (nx ny nz)."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--scale", type=int, default=2, help="factor on x and y cell counts")
    args = ap.parse_args()
    if args.dir.exists():
        print(f"error: {args.dir} exists; give a new directory", file=sys.stderr)
        return 2
    if args.scale < 1:
        print("error: --scale must be >= 1", file=sys.stderr)
        return 2
    shutil.copytree(TUTORIAL, args.dir)
    for gz in args.dir.rglob("*.gz"):
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
        gz.unlink()
    mesh = args.dir / "system" / "blockMeshDict"
    s = args.scale
    text, n = CELLS.subn(
        lambda m: f"{m.group(1)}({int(m.group(2)) * s} {int(m.group(3)) * s} {m.group(4)})",
        mesh.read_text(),
    )
    if n != 5:
        print(f"error: expected 5 blocks in {mesh}, found {n}", file=sys.stderr)
        return 2
    mesh.write_text(text)
    print(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
