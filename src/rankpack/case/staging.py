"""Staging: a case copied into a fresh run directory, meshed and decomposed, ready to run.

Called by backends as their asynchronous `stage` action (the local backend runs it in a
worker thread; a cluster backend may run it where the case volume is). `check` validates
everything that needs no files before anything is created; `stage` builds the run
directory in a staging folder (copy, mesh, decompose) and renames it into place, so a
failure leaves nothing behind. What needs the OpenFOAM installation (its tools, its
``PATH``, its tutorials) goes through `openfoam.tools`: in a staging pod, the
Simulation's image (`foamexec`); else this process's own.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from rankpack.case import confine, mpiabi, openfoam
from rankpack.core.failures import FailureCode
from rankpack.errors import UserError

DECOMPOSITIONS = ("equal", "weighted", "concentric")


@dataclass(frozen=True)
class StageSpec:
    """What to prepare before a launch: a case copied, meshed and decomposed."""

    sim_id: str
    case: str
    """A case directory or an installed tutorial name."""
    n_ranks: int
    runs_root: Path
    """Where the run directory is created (a new, unique directory below it)."""
    iterations: int | None = None
    decompose: str = "equal"
    decompose_weights: tuple[float, ...] = ()
    center: tuple[float, float, float] | None = None
    workdir: Path | None = None
    """An exact run directory (must not exist or be empty) instead of one under runs_root."""
    confined: bool = False
    """Stage a case of someone with fewer rights (the operator's Simulations): a backend that
    can stages it in a sandbox with that user's rights only (the Kubernetes backend: a
    staging pod, `rankpack.case.sandbox`), and `scan` refuses case code before any tool runs."""
    scan: bool = True
    """With ``confined``: refuse what `rankpack.case.confine` finds (defence in depth; the
    sandbox is the boundary). The admin may switch it off (``rankpack operator --case-scan
    off``)."""
    volume: str | None = None
    """Where the run directory lives in the simulation's pods (``SimSpec.volume``): a
    sandbox mounts its run directory from there."""
    case_root: str | None = None
    """The admin's case root the case path was admitted under (`rankpack.operator.admission`):
    the one part of the user's files a sandbox mounts (read-only); None: a tutorial name."""
    in_place: bool = False
    """Build the case in ``workdir`` itself (an empty directory the stage may not replace: a
    sandbox's mount), emptied again on failure, instead of in a sibling renamed into place."""
    namespace: str | None = None
    """Where the simulation will run, for a backend that places in several (the operator
    serving several Kubernetes namespaces); None: the backend's own. Staging ignores it."""
    resume: StagedCase | None = None
    """A case staged before whose run was cut short (a lost node): nothing is copied; it is
    made to start again from its last complete write (`resume`)."""
    image: str | None = None
    """A backend with images: what the sandbox runs (``SimSpec.image``; None: its own)."""
    pull_secrets: tuple[str, ...] = ()
    """A backend with images: Secrets that pull ``image``, by name."""


@dataclass(frozen=True)
class StagedCase:
    """A prepared case, ready to launch."""

    run_dir: Path
    case_name: str
    case_source: str
    solver: str
    cells_per_rank: tuple[int, ...]
    expected_iterations: int
    warnings: tuple[str, ...] = ()
    resumed_from: str | None = None
    """The time it starts again from (its last complete write; `resume`), None: the start."""
    start_iterations: int = 0
    """Time steps done before that time (its log counts on from there)."""
    mpi: str | None = None
    """The MPI ABI family its solver links (`detect_mpi`): ``openmpi``, ``mpich``, `NO_MPI`
    (neither), or None (not told: the solver not found where staging ran)."""

    @property
    def log_path(self) -> Path:
        return self.run_dir / f"log.{self.solver}"


class StageRefused(UserError):
    """A staging error whose code is known already (a sandbox's answer: `stagewire`)."""

    def __init__(self, message: str, code: FailureCode) -> None:
        super().__init__(message)
        self.code = code


def failure_code(error: UserError) -> FailureCode:
    """The code of a staging error: the case is none, it is refused by confinement, or
    staging it failed."""
    if isinstance(error, StageRefused):
        return error.code
    if isinstance(error, openfoam.NotACase):
        return FailureCode.NOT_A_CASE
    if isinstance(error, confine.CaseNotConfined):
        return FailureCode.CASE_NOT_CONFINED
    return FailureCode.STAGE_FAILED


def check(spec: StageSpec) -> openfoam.CaseSource:
    """Validation that reads no more than the source case: done before anything is created."""
    check_values(spec)
    source = openfoam.resolve_case(spec.case, on_link=confine.check_link if spec.confined else None)
    if source.readable and openfoam.has_mesh(source.path):
        _check_cells(openfoam.n_cells(source.path), spec.n_ranks, source.name)
    if spec.workdir is not None:
        check_workdir(spec.workdir.expanduser().resolve())
    return source


def check_workdir(final: Path) -> None:
    """A run directory asked for by path must be new or empty."""
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise UserError(f"run directory {final} exists and is not empty; give a new one")


def check_values(spec: StageSpec) -> None:
    """Validation that reads no file: what a sandbox's caller checks (the case is the
    sandbox's to read)."""
    if spec.iterations is not None and spec.iterations < 1:
        raise UserError(f"the iteration count must be at least 1, got {spec.iterations}")
    if spec.decompose not in DECOMPOSITIONS:
        raise UserError(
            f"unknown decomposition '{spec.decompose}'; use one of {', '.join(DECOMPOSITIONS)}"
        )
    if spec.n_ranks < 1:
        raise UserError(f"a simulation needs at least one rank, got {spec.n_ranks}")


def resume(spec: StageSpec) -> StagedCase:
    """The staged case of ``spec.resume`` made to run again from its last complete write
    (`restart.prepare_resume`: later partial writes removed, ``startFrom latestTime``, the
    earlier log and launch files kept aside); from its start when nothing was written."""
    staged = spec.resume
    if staged is None:
        raise UserError("nothing to resume")
    if not (staged.run_dir / "system" / "controlDict").is_file():
        raise UserError(f"cannot resume {staged.run_dir}: its case is gone")
    from rankpack.case import restart

    point = restart.prepare_resume(staged.run_dir, len(staged.cells_per_rank), staged.solver)
    return replace(staged, warnings=(), resumed_from=point.time, start_iterations=point.steps)


NO_MPI = "none"
"""`StagedCase.mpi` of a solver that links no MPI library rankpack knows."""


def detect_mpi(solver: str) -> str | None:
    """The MPI ABI family ``solver`` links, found on OpenFOAM's PATH where its tools run
    (`openfoam.tools`: on a cluster, the Simulation's image) and listed by the dynamic
    loader there (`mpiabi`, bounded); `NO_MPI` if it links neither family, None if it
    cannot be told (no such program, no loader, a listing that fails)."""
    tools = openfoam.tools()
    try:
        program = tools.which(solver)
        if program is None:
            return None
        listing = tools.listing(program)
    except UserError:
        return None
    return mpiabi.family_of(listing) or NO_MPI


def stage(spec: StageSpec) -> StagedCase:
    """Copy, mesh and decompose; the run directory appears only when all of it worked."""
    if spec.resume is not None:
        return resume(spec)
    source = check(spec)
    if spec.workdir is not None:
        final = spec.workdir.expanduser().resolve()
    else:
        final = new_run_dir(spec.runs_root, source.name, spec.n_ranks)
    if spec.in_place:
        staging = final
    else:
        staging = final.parent / f".staging-{uuid.uuid4().hex[:8]}-{final.name}"
    scan = spec.confined and spec.scan
    warnings: tuple[str, ...] = ()
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        openfoam.copy_case(source, staging)
        if scan:
            confine.check_case(staging)  # before any OpenFOAM tool reads a dictionary
        solver = openfoam.check_solver(staging)  # (a tutorial of the image: checked now)
        openfoam.ensure_mesh(staging, confined=scan)
        _check_cells(openfoam.n_cells(staging), spec.n_ranks, source.name)
        if spec.iterations is not None:
            tc = openfoam.set_iterations(staging, spec.iterations)
        else:
            tc = openfoam.read_time_control(staging)
        cells, warnings = _decompose(staging, spec)
        if not spec.in_place:
            staging.rename(final)  # replaces the empty (reserved) directory atomically
    except BaseException:
        if spec.in_place:
            empty(final)
        else:
            shutil.rmtree(staging, ignore_errors=True)
        if spec.workdir is None:
            with contextlib.suppress(OSError):
                final.rmdir()  # the reservation, still empty
        raise
    return StagedCase(
        run_dir=final,
        case_name=source.name,
        case_source=str(source.path),
        solver=solver,
        cells_per_rank=tuple(cells),
        expected_iterations=tc.steps,
        warnings=warnings,
        mpi=detect_mpi(solver),
    )


def empty(directory: Path) -> None:
    """Remove what ``directory`` holds, never following a link out of it (``rmtree`` walks
    by file descriptor), and keep the directory."""
    with contextlib.suppress(OSError):
        for entry in list(directory.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()


def new_run_dir(runs_root: Path, name: str, n_ranks: int) -> Path:
    """A new, empty run directory below ``runs_root`` named after the case and its ranks,
    reserved (created) so that a stage at the same moment takes another name."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    base = runs_root / f"{stamp}-{safe}-{n_ranks}r"
    runs_root.mkdir(parents=True, exist_ok=True)
    candidate, i = base, 1
    while True:
        try:
            candidate.mkdir()  # reserved: a stage running at the same moment takes another name
            return candidate
        except FileExistsError:
            i += 1
            candidate = base.with_name(f"{base.name}-{i}")


def _check_cells(cells: int, n_ranks: int, name: str) -> None:
    if n_ranks > cells:
        raise UserError(f"{n_ranks} ranks but {name} has only {cells} cells; use fewer ranks")


def _decompose(case_dir: Path, spec: StageSpec) -> tuple[list[int], tuple[str, ...]]:
    n = spec.n_ranks
    if spec.decompose == "equal":
        openfoam.write_decompose_dict(case_dir, n)
        return openfoam.decompose(case_dir), ()
    from rankpack.case.decomposition import decompose_case

    weights = list(spec.decompose_weights) or [1.0] * n
    result = decompose_case(case_dir, n, spec.decompose, weights, spec.center)
    if result.openfoam_cells is None:
        raise UserError(f"decomposePar did not run for {case_dir}")
    return list(result.openfoam_cells), tuple(result.warnings)
