"""The OpenFOAM of a Simulation's own image, from a staging pod's main container:
`ExecTools`, the `foamtools.FoamTools` that sends each command to the pod's sidecar.

A staging pod (`rankpack.backend.kubernetes.objects.stagepods`) runs staging's Python in
rankpack's image and, beside it, a native sidecar in the Simulation's image that runs
``rankpack-rankd KEY --loopback`` (``tools/keyexec``): a server on the pod's own loopback
that runs what a caller with the pod's key asks. Everything staging does with OpenFOAM
is sent there with ``rankpack-exec --argv`` as an argv (never a shell line: a case's words
stay words), in the directory it runs in, with the image's own environment:

- an OpenFOAM tool (blockMesh, decomposePar, a case's Allrun steps): its output to the
  log as `foamtools.run_logged` writes it, its process group stopped when staging stops;
- ``rankpack-tools which NAME``: a program on the image's ``PATH``;
- the loader's ``--list PROGRAM``: the solver's libraries (`mpiabi`'s time and size);
- ``rankpack-tools find-case NAME`` and ``copy-case``: a tutorial where the image keeps
  them, copied into the run directory within `foamtools.CopyBounds` (``tools/casefiles``).

Every answer is read bounded in time and size (`foamtools.run_bounded`) and parsed as the
image's: strictly. `install` is the pod's init container (rankpack's image): the tools
binary, a new key and the hosts file into the pod's own volume, where the sidecar starts
from and the main container enters it with. Both sides see that volume read-only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from rankpack import untrusted
from rankpack.case import mpiabi
from rankpack.case.foamtools import CopyBounds, FoamTools, Tutorials, run_bounded, run_logged
from rankpack.errors import UserError

BINARY = "rankpack-tools"
"""The static tools binary (``tools/``), shipped in this package's ``_lib``."""
KEY_FILE = "key"
HOSTS_FILE = "hosts.json"
HOST = "openfoam"
"""The sidecar's name in the hosts file: this pod's loopback."""
KEY_ENV = "RANKPACK_RANKD_KEY"
HOSTS_ENV = "RANKPACK_RANKD_HOSTS"
PORT_ENV = "RANKPACK_RANKD_PORT"
"""``rankpack-exec``'s environment (as in `backend.kubernetes.objects.keyed`)."""

WHICH_TIMEOUT_S = 10.0
FIND_TIMEOUT_S = 60.0
"""A walk of the image's tutorials (Debian's: about 1 s)."""
COPY_TIMEOUT_S = 1800.0
"""A tutorial's copy (the pod's own deadline is the tighter bound)."""
ANSWER_MAX = 64 << 10
"""The most of an answer (``which``, ``find-case``, ``copy-case``) that is read."""


def binary_bytes() -> bytes:
    """The tools binary as this installation ships it (`OSError` if it was not built:
    ``python -m rankpack.devcluster.toolsbuild``)."""
    return (resources.files("rankpack") / "_lib" / BINARY).read_bytes()


def install(directory: Path) -> None:
    """The staging pod's tools volume: the binary, a new key (256 random bits, hex) and the
    hosts file naming the sidecar's address (loopback)."""
    d = untrusted.own_dir(directory)
    untrusted.write_file(d / BINARY, binary_bytes(), 0o555)
    untrusted.write_file(d / KEY_FILE, os.urandom(32).hex().encode(), 0o444)
    untrusted.write_file(d / HOSTS_FILE, json.dumps({HOST: "127.0.0.1"}).encode(), 0o444)


@dataclass(frozen=True)
class ExecTools:
    """`foamtools.FoamTools` in the staging pod's sidecar, through the tools at
    ``directory`` (`install`; the sidecar mounts them at the same path)."""

    directory: Path
    port: int | None = None
    """Where the sidecar listens, if not rankpack-rankd's own port (tests on one host)."""
    fallback: FoamTools | None = None
    """Where staging's own tools run if the image has none of that name (`FoamTools`)."""
    local_files = False

    def _env(self) -> dict[str, str]:
        env = {"PATH": "/usr/bin:/bin", KEY_ENV: str(self.directory / KEY_FILE),
               HOSTS_ENV: str(self.directory / HOSTS_FILE)}  # fmt: skip
        if self.port is not None:
            env[PORT_ENV] = str(self.port)
        return env

    def _exec(self, argv: Sequence[str], cwd: Path | None = None) -> list[str]:
        """``argv`` run in the sidecar (in ``cwd``) by ``rankpack-exec --argv``."""
        where = ["--dir", str(cwd)] if cwd is not None else []
        return [str(self.directory / BINARY), "exec", "--argv", *where, HOST, *argv]

    def _ask(self, words: Sequence[str], timeout_s: float, cwd: Path | None = None
             ) -> tuple[int | None, str]:  # fmt: skip
        """``rankpack-tools WORDS`` in the sidecar: its status and its output (bounded)."""
        argv = self._exec([str(self.directory / BINARY), *words], cwd)
        rc, out = run_bounded(argv, self._env(), timeout_s, ANSWER_MAX)
        return rc, out.decode("utf-8", errors="replace")

    def which(self, program: str, cwd: Path | None = None) -> str | None:
        rc, out = self._ask(["which", program], WHICH_TIMEOUT_S, cwd)
        if rc == 1:
            return None
        found = out.strip()
        if rc != 0 or not found.startswith("/") or "\n" in found:
            raise UserError(_failed(f"finding {program[:80]} in the Simulation's image", rc, out))
        return found

    def run(self, argv: Sequence[str], cwd: Path, log: BinaryIO) -> int:
        return run_logged(self._exec(argv, cwd), cwd=cwd, env=self._env(), log=log)

    def listing(self, program: str) -> str:
        loader = mpiabi.this_loader()
        argv = self._exec([str(loader), "--list", program])
        rc, out = run_bounded(argv, self._env(), mpiabi.LISTING_TIMEOUT_S,
                              mpiabi.MAX_LISTING_CHARS)  # fmt: skip
        return mpiabi.read_listing(rc, out, loader, program)

    def tutorials(self, name: str) -> Tutorials:
        rc, out = self._ask(["find-case", name], FIND_TIMEOUT_S)
        found = _json(out) if rc == 0 else None
        if not isinstance(found, dict) or set(found) != {"root", "cases"}:
            raise UserError(_failed("finding the tutorial in the Simulation's image", rc, out))
        root, cases = found["root"], found["cases"]
        if not isinstance(root, str) or not isinstance(cases, list):
            raise UserError(_failed("finding the tutorial in the Simulation's image", rc, out))
        missing = ("the Simulation's image has no OpenFOAM tutorials ($RANKPACK_FOAM_EXAMPLES, "
                   "$FOAM_TUTORIALS or /usr/share/doc/openfoam-examples/examples); give a "
                   "case directory")  # fmt: skip
        if not root:
            return Tutorials(None, (), missing)
        top = Path(root)
        if not top.is_absolute():
            raise UserError(_failed("finding the tutorial in the Simulation's image", rc, out))
        return Tutorials(top, tuple(sorted(top / _relative(c) for c in cases)), missing)

    def copy_tutorial(self, source: Path, dest: Path, bounds: CopyBounds) -> int:
        skips = [w for s in bounds.skip for w in ("--skip", s)]
        rc, out = self._ask(["copy-case", *skips, "--max-files", str(bounds.max_files),
                             "--max-bytes", str(bounds.max_bytes), str(source), str(dest)],
                            COPY_TIMEOUT_S)  # fmt: skip
        done = _json(out) if rc == 0 else None
        copied = done.get("bytes") if isinstance(done, dict) else None
        if type(copied) is not int or not 0 <= copied <= bounds.max_bytes:
            raise UserError(_failed(f"copying the tutorial {source.name}", rc, out))
        return copied


def _json(text: str) -> object:
    lines = text.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def _relative(text: object) -> PurePosixPath:
    """A case's place below the tutorials, as the image said it: relative, no ``..``."""
    if not isinstance(text, str) or not text or len(text) > 1000:
        raise UserError("the Simulation's image named a tutorial out of shape")
    rel = PurePosixPath(text)
    if rel.is_absolute() or ".." in rel.parts:
        raise UserError("the Simulation's image named a tutorial out of shape")
    return rel


def _failed(what: str, rc: int | None, out: str) -> str:
    """A one-line error of a call to the sidecar: its last line of output, or its status."""
    if rc is None:
        return f"{what} did not finish in time"
    last = [line.strip() for line in out.strip().splitlines()[-1:]]
    said = last[0][:300] if last and last[0] else f"status {rc}"
    return f"{what} failed ({said})"
