"""The staging sandbox: what a staging pod runs (``rankpack-stage``).

A Simulation's case is the input of a user with fewer rights than the operator, and
staging it reads it and runs OpenFOAM's tools on it (a dictionary can load a library or
run a command). So it is staged here, in a pod of the Simulation's own namespace with
that user's rights only (`rankpack.backend.kubernetes.objects.stagepods`): no token, a
read-only root, the namespace's case root read-only and the run directory read-write,
bounded CPU, memory, disk and time. This program resolves the case path *inside* that pod
(a link swapped in after admission reaches nothing outside what is mounted), copies,
scans (`rankpack.case.confine`, defence in depth), meshes and decomposes into the run
directory (`staging.stage`, in place), and answers in the container's termination message
(`stagewire`): the one thing the operator reads of it.

- ``rankpack-stage --tools DIR REQUEST``: the pod's main container, in rankpack's image;
  everything of OpenFOAM (its tools, its ``PATH``, its tutorials) runs in the pod's
  sidecar, in the Simulation's image, through DIR's ``rankpack-exec`` (`foamexec`). This
  is the one place that chooses where OpenFOAM runs (`foamtools.using`);
- ``rankpack-stage --install-tools DIR``: the pod's init container: DIR made ready for
  the sidecar and for the main container (`foamexec.install`);
- ``rankpack-stage REQUEST``: with this process's own OpenFOAM (tests, one image).

Exit codes: 0 staged, 2 refused or failed (the answer says why), 1 a bug (the answer too).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rankpack.case import foamexec, foamtools, openfoam, stagewire, staging
from rankpack.core.failures import FailureCode
from rankpack.errors import UserError

TERMINATION_LOG = Path("/dev/termination-log")
"""Where the container's answer goes (the kubelet reads it into the pod's status)."""


def run(request: str) -> tuple[int, str]:
    """Stage what ``request`` asks; the exit code and the answer."""
    try:
        spec = stagewire.parse_request(request)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        return 2, stagewire.failure_text(f"a staging request out of shape: {exc}",
                                         FailureCode.STAGE_FAILED)  # fmt: skip
    try:
        staged = staging.stage(spec)
        cells = staged.run_dir / stagewire.CELLS_FILE

        def write_cells(text: str) -> None:
            cells.write_text(text)

        return 0, stagewire.answer_text(staged, write_cells=write_cells)
    except UserError as exc:
        return 2, stagewire.failure_text(str(exc), staging.failure_code(exc))
    except Exception as exc:  # a bug or a tool's crash: said, not hidden
        return 1, stagewire.failure_text(f"staging failed: {exc!r}", FailureCode.STAGE_FAILED)


USAGE = (
    "usage: rankpack-stage [--tools DIR] REQUEST (the JSON a staging pod is given), "
    "or rankpack-stage --install-tools DIR"
)


def install_tools(directory: Path, answer_to: Path) -> int:
    """The init container: `foamexec.install`; a failure said in its termination message."""
    try:
        foamexec.install(directory)
    except OSError as exc:
        said = f"cannot put the staging tools in {directory}: {exc}"
        print(said, file=sys.stderr)
        with contextlib.suppress(OSError):
            answer_to.write_text(said)
        return 1
    return 0


def main(argv: Sequence[str] | None = None, answer_to: Path = TERMINATION_LOG) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    os.umask(0o022)
    if len(args) == 2 and args[0] == "--install-tools":
        return install_tools(Path(args[1]), answer_to)
    tools: foamtools.FoamTools | None = None
    if len(args) == 3 and args[0] == "--tools":
        # an image without OpenFOAM's tools (an MPI code's): blockMesh and decomposePar
        # run in this container's (rankpack's image), the solver is still the image's
        tools, args = foamexec.ExecTools(Path(args[1]), fallback=openfoam.HERE), args[2:]
    if len(args) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    if tools is None:
        code, answer = run(args[0])
    else:
        with foamtools.using(tools):
            code, answer = run(args[0])
    print(answer, flush=True)  # (the pod's log, for people)
    try:
        answer_to.write_text(answer)
    except OSError as exc:
        print(f"cannot write the answer to {answer_to}: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())
