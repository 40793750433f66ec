"""Which images a Simulation may run, and which solvers each of them may run: the cluster
admin's allowlist as data, shared by admission (`rankpack.operator.admission`, when a
Simulation arrives) and the launch check (`rankpack.controller.launching`, the case's own
``application``).

An image prefix matches itself, or an image that continues it after ``/``, ``:`` or ``@``
(so ``registry.example/cfd`` allows ``registry.example/cfd/foam:12`` and
``registry.example/cfd:12``, never ``registry.example/cfd-other/foam``); a prefix that ends
with one of them matches whatever follows it. The admin may name the solvers an image
prefix may run (``--allow-image PREFIX=SOLVER,...``): an image under it runs only those
(the longest matching prefix decides); an image under no such prefix runs the default list
(the operator's own image's OpenFOAM applications and ``--solver`` names).

And which MPI the image's solver links (`mpi_refusal`): what staging found in the image
(`rankpack.case.staging.detect_mpi`) against what the Simulation says (``spec.mpi``).
"""

from __future__ import annotations

from collections.abc import Iterable

from rankpack.core.failures import Failure, FailureCode

ImageSolvers = tuple[tuple[str, frozenset[str]], ...]
"""Image prefix -> the solvers images under it may run (the admin's ``PREFIX=SOLVER,...``)."""


def _matches(image: str, prefix: str) -> bool:
    return bool(prefix) and (image == prefix or (image.startswith(prefix) and (
        prefix[-1] in "/:@" or image[len(prefix)] in "/:@")))  # fmt: skip


def image_allowed(image: str, prefixes: Iterable[str]) -> bool:
    """``image`` lies under one of ``prefixes`` (see the module doc)."""
    return any(_matches(image, p) for p in prefixes)


def solvers_for(
    image: str | None, default: frozenset[str], image_solvers: ImageSolvers = ()
) -> frozenset[str]:
    """The solvers ``image`` may run: those of the longest prefix it lies under that names
    its own, else ``default`` (None: the operator's own image)."""
    if image is None:
        return default
    named = [(p, s) for p, s in image_solvers if _matches(image, p)]
    return max(named, key=lambda ps: len(ps[0]))[1] if named else default


NO_MPI = "none"
"""A staged case's ``mpi`` when its solver links neither family (`rankpack.case.staging.NO_MPI`)."""
FAMILY_NAMES = {
    "openmpi": "Open MPI (libmpi.so.40)",
    "mpich": "MPICH (libmpich.so.12 or libmpi.so.12)",
}


def mpi_refusal(declared: str, linked: str | None, solver: str) -> Failure | None:
    """Why a case whose solver links ``linked`` (its staged ``mpi``: a family, `NO_MPI`, or
    None when staging could not tell) cannot run as a Simulation that says ``declared``;
    None if it can. `FailureCode.UNSUPPORTED_MPI`: no MPI rankpack can profile;
    `FailureCode.MPI_MISMATCH`: the other family (its launcher would not start it)."""
    if linked is None or linked == declared:
        return None
    if linked == NO_MPI:
        return Failure(FailureCode.UNSUPPORTED_MPI, (
            f"{solver!r} (the case's application) links no MPI library rankpack can run and "
            "profile: neither Open MPI (libmpi.so.40) nor MPICH (libmpich.so.12, libmpi.so.12); "
            "use a solver built with one of them"
        ))  # fmt: skip
    return Failure(FailureCode.MPI_MISMATCH, (
        f"{solver!r} (the case's application) links {FAMILY_NAMES.get(linked, linked)}, but the "
        f"Simulation says mpi: {declared}; set spec.mpi to {linked} (rankpack submit --mpi "
        f"{linked})"
    ))  # fmt: skip
