"""``rankpack-tools``, built from the checkout's ``tools/`` (Go, no module outside the
standard library) into ``src/rankpack/_lib/``, where the Kubernetes backend finds it
(`rankpack.backend.kubernetes.starting.tools`).

One static binary (``CGO_ENABLED=0``: no libc, so no glibc floor) that the operator puts on
a Simulation's case volume: what must run inside the Simulation's own image (the rank
pods' ``rankpack-rankd``, mpirun's rsh agent ``rankpack-exec``, the launcher's last step
``rankpack-launch``) without rankpack's Python there. docs/own-image.md.

Called by ``setup.sh test`` (``python -m rankpack.devcluster.toolsbuild``), by the image
build's code layer (`applayers.build_code`) and by the tools' own test
(``tests/integration/test_tools.py``: ``go test``). Go is the one `binaries.find_go` finds
or fetches (the Kubernetes build's); its caches are the same.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from rankpack.devcluster.binaries import CACHE_ROOT, find_go, go_env
from rankpack.errors import UserError

NAME = "rankpack-tools"
GO_NEEDED = (1, 22)
"""tools/go.mod's ``go`` line."""


def source_dir(source_root: Path) -> Path:
    found = source_root / "tools"
    if not (found / "go.mod").is_file():
        raise UserError(f"{source_root} has no tools/go.mod: not a rankpack checkout")
    return found


def go_command(source_root: Path, args: Sequence[str], timeout_s: float = 600) -> str:
    """``go ARGS`` in ``tools/`` (static, reproducible: no cgo, no VCS stamp); its output.
    `UserError` with the output's tail if it fails."""
    go = find_go(GO_NEEDED)
    env = go_env(go, CACHE_ROOT)
    env["GOFLAGS"] = "-buildvcs=false -trimpath"
    proc = subprocess.run(
        [str(go), *args], cwd=source_dir(source_root), env=env, capture_output=True,
        text=True, timeout=timeout_s, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise UserError(f"go {' '.join(args)} failed in {source_dir(source_root)}:\n{tail}")
    return proc.stdout + proc.stderr


def build(source_root: Path, out_dir: Path | None = None) -> Path:
    """Build ``rankpack-tools`` into ``out_dir`` (default the checkout's ``_lib``); its path."""
    out = (out_dir or source_root / "src" / "rankpack" / "_lib") / NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    go_command(source_root, ["build", "-ldflags=-s -w", "-o", str(out), "./cmd/rankpack-tools"])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rankpack.devcluster.toolsbuild [SOURCE_ROOT]`` (default: this checkout)."""
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0]) if args else Path(__file__).resolve().parents[3]
    try:
        print(build(root))
    except UserError as exc:
        print(f"rankpack: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
