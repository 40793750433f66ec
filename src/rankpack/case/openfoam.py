"""OpenFOAM cases: resolve a tutorial or directory, copy it into a run directory, mesh it,
decompose it, and edit its controlDict.

Called by the CLI (`run`, `demo`, `decompose`) before a plan is made. The source case is
never modified: everything happens in the run directory. File edits go through foamlib
(a maintained OpenFOAM file parser) rather than regular expressions.

What needs the OpenFOAM installation itself (its tools, its ``PATH``, its tutorials) goes
through `tools` (`foamtools.FoamTools`): `HERE`, this process's environment, unless a
staging sandbox put the Simulation's image in force (`foamtools.using`).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rankpack import paths, quantities
from rankpack.case import foamtools, mpiabi
from rankpack.case.foamtools import CopyBounds, FoamTools, Tutorials
from rankpack.errors import UserError


class NotACase(UserError):
    """The case path or tutorial name names no OpenFOAM case (no such directory or
    tutorial, a file, a directory without system/controlDict): failure code ``NotACase``."""


EXAMPLES_ROOT = Path(
    os.environ.get("RANKPACK_FOAM_EXAMPLES", "/usr/share/doc/openfoam-examples/examples")
)
# The seed papers' cases; other tutorials are found by directory name.
KNOWN_TUTORIALS = {
    "pitzDaily": "incompressible/simpleFoam/pitzDaily",
    "aerofoilNACA0012": "compressible/rhoSimpleFoam/aerofoilNACA0012",
}
# Allrun steps that are not mesh generation (they run later, under rankpack's control).
_NOT_MESH_STEPS = {"decomposePar", "reconstructPar", "reconstructParMesh", "foamDictionary"}


@dataclass(frozen=True)
class CaseSource:
    path: Path
    name: str
    tutorial: bool
    readable: bool = True
    """False: a tutorial in the Simulation's image, whose files are read once copied."""


def foam_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment OpenFOAM tools need (Debian layout: /usr/share/openfoam)."""
    env = dict(os.environ if base is None else base)
    if "WM_PROJECT_DIR" not in env and Path("/usr/share/openfoam").is_dir():
        env["WM_PROJECT_DIR"] = "/usr/share/openfoam"
    real_pstream = Path("/usr/lib/openmpi-system")
    if real_pstream.is_dir():
        parts = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
        if str(real_pstream) not in parts:
            env["LD_LIBRARY_PATH"] = ":".join([str(real_pstream), *parts])
    return env


def rank_env() -> dict[str, str]:
    """OpenFOAM's variables every rank needs (Debian layout), forwarded to the ranks."""
    env = foam_env()
    return {k: v for k, v in env.items() if k in ("WM_PROJECT_DIR", "LD_LIBRARY_PATH")}


def _is_case(path: Path) -> bool:
    system = path / "system"
    return (system / "controlDict").is_file() or (system / "controlDict.gz").is_file()


# Top-level entries a copy of the case leaves out (and rankpack's own staging directories).
COPY_SKIPS = ("processor", "log.", ".rankpack-")


def resolve_case(
    text: str,
    *,
    require_solver: bool = True,
    on_link: Callable[[Path, Path, Path], None] | None = None,
) -> CaseSource:
    """A case directory, or the name of an installed tutorial (e.g. pitzDaily).

    A directory is walked first (`rankpack.paths.check_tree`, which also calls ``on_link``
    for every symlink in it): a FIFO, a device, a broken symlink or a symlink loop is
    refused before anything reads or copies it. With
    ``require_solver`` the controlDict's ``application`` must be an installed program,
    so a misspelt solver is reported before any copying or meshing.
    """
    quantities.path_text(text, "case")
    shown = quantities.literal(text, 80)
    path = Path(text).expanduser()
    try:
        exists = path.exists()
        is_dir = path.is_dir()
    except OSError as exc:
        raise UserError(f"case {shown} cannot be read ({exc.strerror})") from None
    if exists or os.path.islink(path):
        if not exists:
            raise UserError(f"case {shown} is a broken symlink or a symlink loop")
        if not is_dir:
            raise NotACase(f"{shown} is a file; give an OpenFOAM case directory or a tutorial name")
        if not os.access(path, os.R_OK | os.X_OK):
            raise UserError(f"case directory {shown} cannot be read")
        paths.check_tree(path, skip_top=COPY_SKIPS, on_link=on_link)
        if not _is_case(path):
            raise NotACase(
                f"{shown} is not an OpenFOAM case (no system/controlDict); "
                "give a case directory or a tutorial name such as pitzDaily"
            )
        source = CaseSource(path.resolve(), path.resolve().name, tutorial=False)
    elif "/" in text:
        raise NotACase(f"case directory {shown} does not exist")
    else:
        source = CaseSource(find_tutorial(text), text, tutorial=True,
                            readable=tools().local_files)  # fmt: skip
    if require_solver and source.readable:
        check_solver(source.path)
    return source


def _control_dict(case_dir: Path) -> Path:
    plain = case_dir / "system" / "controlDict"
    gz = case_dir / "system" / "controlDict.gz"
    return plain if plain.is_file() or not gz.is_file() else gz


def check_solver(case_dir: Path) -> str:
    """The controlDict's application, which must be an installed OpenFOAM program."""
    from foamlib import FoamFile  # (lazy: ~0.15 s to import)

    try:
        application = FoamFile(_control_dict(case_dir)).get("application")
    except Exception as exc:  # foamlib raises its own parse errors; the file is the user's
        raise UserError(
            f"{_control_dict(case_dir)} cannot be parsed ({type(exc).__name__}); "
            "fix the controlDict"
        ) from None
    if not isinstance(application, str) or not application:
        raise UserError(f"{case_dir}/system/controlDict has no 'application' entry")
    if "/" in application or tools().which(application) is None:
        raise UserError(
            f"the controlDict of {case_dir} names application '{application}', which is not "
            "an installed OpenFOAM solver; fix 'application' in system/controlDict "
            "(e.g. simpleFoam) or install it"
        )
    return application


def find_tutorial(name: str) -> Path:
    """The tutorial ``name`` where `tools` keeps them (a path there)."""
    found = tools().tutorials(name)
    if found.root is None:
        raise UserError(found.missing)
    known = KNOWN_TUTORIALS.get(name)
    if known and found.root / known in found.cases:
        return found.root / known
    matches = [m for m in found.cases if m.name == name]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        listed = ", ".join(str(m.relative_to(found.root)) for m in matches[:4])
        raise UserError(f"tutorial name {name} is ambiguous ({listed}); give the case directory")
    raise NotACase(
        f"unknown tutorial '{name}'; try pitzDaily or aerofoilNACA0012, or give a case directory"
    )


MAX_CASE_FILES = 100_000
"""The most files a case may hold (its copy is refused above, with what to do)."""
MAX_CASE_BYTES = 8 << 30
"""The most bytes a case may hold, and its gzipped files unpack to, together."""


def _ignore(source: CaseSource) -> Callable[[str, list[str]], list[str]]:
    def ignore(directory: str, names: list[str]) -> list[str]:
        if Path(directory) == source.path:
            return [n for n in names if n.startswith(COPY_SKIPS)]
        return []

    return ignore


def check_case_size(source: CaseSource) -> int:
    """The bytes of what `copy_case` copies (here); UserError when the case holds more files
    or bytes than `MAX_CASE_FILES` or `MAX_CASE_BYTES` (read by walking it once)."""
    files, size = 0, 0
    for top, dirs, names in os.walk(source.path):
        if Path(top) == source.path:
            dirs[:] = [d for d in dirs if not d.startswith(COPY_SKIPS)]
            names = [n for n in names if not n.startswith(COPY_SKIPS)]
        files += len(names)
        for n in names:
            with contextlib.suppress(OSError):
                size += os.stat(os.path.join(top, n)).st_size
        if files > MAX_CASE_FILES or size > MAX_CASE_BYTES:
            raise UserError(
                f"{source.name} holds more than {MAX_CASE_FILES} files or {MAX_CASE_BYTES >> 30} "
                "GiB; give the case without its results (time directories, processor*)"
            )
    return size


def _copy_here(source: CaseSource, dest: Path) -> int:
    size = check_case_size(source)
    shutil.copytree(source.path, dest, ignore=_ignore(source), symlinks=False,
                    dirs_exist_ok=True)  # fmt: skip
    return size


def copy_case(source: CaseSource, dest: Path) -> None:
    """Copy the case (not its processor*/ or results) and unpack gzipped files; ``dest``
    may exist if empty. Bounded: `check_case_size` first, and what gzipped files unpack to
    counts towards `MAX_CASE_BYTES` (a small ``.gz`` may unpack to gigabytes). A tutorial
    is copied where `tools` keeps it (the Simulation's image, for a staging pod)."""
    if source.tutorial:
        bounds = CopyBounds(COPY_SKIPS, MAX_CASE_FILES, MAX_CASE_BYTES)
        copied = tools().copy_tutorial(source.path, dest, bounds)
    else:
        copied = _copy_here(source, dest)
    budget = MAX_CASE_BYTES - copied
    for gz in dest.rglob("*.gz"):
        budget = _gunzip(gz, gz.with_suffix(""), budget, dest)
        gz.unlink()
    orig = dest / "0.orig"
    if orig.is_dir() and not (dest / "0").exists():
        shutil.copytree(orig, dest / "0")


def _gunzip(gz: Path, target: Path, budget: int, case: Path) -> int:
    """Unpack ``gz`` into ``target`` within ``budget`` bytes; what is left of it."""
    try:
        with gzip.open(gz, "rb") as src, open(target, "wb") as out:
            while chunk := src.read(1 << 20):
                budget -= len(chunk)
                if budget < 0:
                    raise UserError(
                        f"{gz.relative_to(case)} unpacks to more than the case may hold "
                        f"({MAX_CASE_BYTES >> 30} GiB in all); give it unpacked or smaller"
                    )
                out.write(chunk)
    except (OSError, EOFError) as exc:
        raise UserError(
            f"{gz.relative_to(case)} cannot be unpacked ({exc}); fix or remove it"
        ) from None
    return budget


def run_tool(case_dir: Path, argv: list[str], log_name: str) -> None:
    """Run an OpenFOAM utility in the case where `tools` runs them (or, if that image has
    none of that name, where its `fallback` does: said on the log's first line), logging to
    log.<name>; UserError on failure.

    The tool runs under `foamtools.run_logged` (its process group stopped on Ctrl-C,
    SIGTERM, any exception or this process's death). A failed tool's log is copied to a
    place that outlives staging directories, and the message names it.
    """
    log = case_dir / f"log.{log_name}"
    t, note = tools(), b""
    found = t.which(argv[0], case_dir) is not None
    if not found and t.fallback is not None and t.fallback.which(argv[0], case_dir):
        note = (f"rankpack: {argv[0]} is not in the Simulation's image; run with "
                "rankpack's own OpenFOAM\n").encode()  # fmt: skip
        t, found = t.fallback, True
    if not found:
        raise UserError(
            f"OpenFOAM tool {argv[0]} not found; install OpenFOAM (apt-get install openfoam)"
        )
    with open(log, "wb") as fh:
        fh.write(note)
        fh.flush()
        returncode = t.run(argv, case_dir, fh)
    if returncode != 0:
        tail = _fatal_line(log)
        kept = keep_log(log, case_dir.name)
        raise UserError(f"{argv[0]} failed in {case_dir.name} ({tail}); see {kept}")


def kept_logs_dir() -> Path:
    """Where logs of failed tools are kept: $RANKPACK_HOME/logs (or the user data dir)."""
    home = os.environ.get("RANKPACK_HOME")
    if home:
        return Path(home).expanduser() / "logs"
    from platformdirs import user_data_dir

    return Path(user_data_dir("rankpack")) / "logs"


def keep_log(log: Path, case_name: str) -> Path:
    """Copy ``log`` where a later cleanup of its directory cannot delete it; the copy's path
    (or the original's, if no copy could be made)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for directory in (kept_logs_dir(), Path("/tmp")):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            dest = directory / f"{case_name}-{stamp}-{os.getpid()}-{log.name}"
            shutil.copyfile(log, dest)
            return dest
        except OSError:
            continue
    return log


def _fatal_line(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if "FOAM FATAL" in line:
            rest = [x.strip() for x in lines[i + 1 : i + 6] if x.strip()]
            return " ".join(rest[:2])[:200] or line.strip()
    return lines[-1].strip()[:200] if lines else "no output"


def mesh_steps(case_dir: Path) -> list[list[str]]:
    """The mesh-generation steps of a case: those in its Allrun before the solver, or blockMesh."""
    allrun = case_dir / "Allrun"
    application = read_application(case_dir)
    steps: list[list[str]] = []
    if allrun.is_file():
        for line in allrun.read_text().splitlines():
            m = re.match(r"\s*runApplication\s+(.*)", line)
            if not m:
                continue
            argv = shlex.split(m.group(1))
            # runApplication's own options: -s SUFFIX, -a/-append, -o/-overwrite
            while argv and argv[0].startswith("-"):
                argv = argv[2:] if argv[0] in ("-s", "-suffix") else argv[1:]
            if not argv:
                continue
            if "getApplication" in argv[0] or argv[0] == application:
                break  # the solver: mesh generation is over
            if argv[0] in _NOT_MESH_STEPS:
                continue
            steps.append(argv)
    if not steps and (case_dir / "system" / "blockMeshDict").is_file():
        steps.append(["blockMesh"])
    return steps


def has_mesh(case_dir: Path) -> bool:
    return (case_dir / "constant" / "polyMesh" / "owner").is_file()


def ensure_mesh(case_dir: Path, *, confined: bool = False) -> None:
    """Mesh the case unless it has a mesh; ``confined``: only OpenFOAM mesh utilities, with
    arguments inside the case (`rankpack.case.confine`)."""
    if has_mesh(case_dir):
        return
    steps = mesh_steps(case_dir)
    if confined:
        from rankpack.case import confine

        confine.check_steps(steps, case_dir)
    if not steps:
        raise UserError(
            f"{case_dir} has no mesh (constant/polyMesh) and no blockMeshDict or Allrun to make one"
        )
    for argv in steps:
        run_tool(case_dir, argv, argv[0])
    if not has_mesh(case_dir):
        raise UserError(f"meshing {case_dir} produced no constant/polyMesh/owner")


def n_cells(case_dir: Path) -> int:
    """Cell count from the owner file's header note (written by every OpenFOAM mesher)."""
    owner = case_dir / "constant" / "polyMesh" / "owner"
    with open(owner, "rb") as fh:
        head = fh.read(4096).decode("latin-1")
    m = re.search(r"nCells:\s*(\d+)", head)
    if not m:
        raise UserError(f"cannot read the cell count from {owner} (no nCells note in its header)")
    return int(m.group(1))


def read_application(case_dir: Path) -> str:
    from foamlib import FoamFile  # (lazy: ~0.15 s to import)

    value = FoamFile(_control_dict(case_dir)).get("application")
    if not isinstance(value, str) or not value:
        raise UserError(f"{case_dir}/system/controlDict has no 'application' entry")
    return value


@dataclass(frozen=True)
class TimeControl:
    start: float
    end: float
    delta_t: float

    @property
    def steps(self) -> int:
        """Time steps (iterations for a steady solver) from start to end."""
        return max(0, round((self.end - self.start) / self.delta_t))


def read_time_control(case_dir: Path) -> TimeControl:
    from foamlib import FoamFile  # (lazy: ~0.15 s to import)

    cd = FoamFile(case_dir / "system" / "controlDict")
    start_from = cd.get("startFrom", "startTime")
    start = float(cd.get("startTime", 0)) if start_from == "startTime" else 0.0  # type: ignore[arg-type]
    return TimeControl(
        start=start,
        end=float(cd["endTime"]),  # type: ignore[arg-type]
        delta_t=float(cd["deltaT"]),  # type: ignore[arg-type]
    )


WRITE_FRACTION = 0.1
"""A staged run writes its fields about every this fraction of its iterations, so that a
run cut short (a lost node) resumes from its last write (`case.restart`)."""


def write_steps(iterations: int, case_steps: float | None, fraction: float = WRITE_FRACTION) -> int:
    """Time steps between two writes of a run of ``iterations`` steps (pure).

    OpenFOAM writes fields only at multiples of the interval, and the last step must be one
    of them (the result a user asked for is on disk), so the interval divides
    ``iterations``. The case's own interval (``case_steps``; None: not in time steps) is kept
    when it does and writes at least every ``fraction`` of the run; else the divisor
    nearest ``fraction`` of the run, between half and twice that; else (a prime count, say)
    the whole run: one write, at the end, and a run cut short starts again from its start.
    """
    if iterations < 1:
        return max(1, iterations)
    target = max(1.0, iterations * fraction)
    if case_steps is not None and case_steps >= 1 and float(case_steps).is_integer():
        steps = int(case_steps)
        if iterations % steps == 0 and steps <= target:
            return steps
    low, high = max(1, int(target // 2)), int(target * 2)
    divisors = [d for d in range(low, min(high, iterations) + 1) if iterations % d == 0]
    if not divisors:
        return iterations
    return min(divisors, key=lambda d: (abs(d - target), d))


def set_iterations(case_dir: Path, iterations: int) -> TimeControl:
    """Stop after ``iterations`` time steps, with the last step written and writes about
    every tenth of the run in between (`write_steps`), in time steps."""
    tc = read_time_control(case_dir)
    end = tc.start + iterations * tc.delta_t
    from foamlib import FoamFile  # (lazy: ~0.15 s to import)

    cd = FoamFile(case_dir / "system" / "controlDict")
    with cd:
        cd["endTime"] = int(end) if float(end).is_integer() else end
        cd["stopAt"] = "endTime"
        control = cd.get("writeControl", "timeStep")
        interval = float(cd.get("writeInterval", 1))  # type: ignore[arg-type]
        case_steps = interval if control == "timeStep" else interval / tc.delta_t
        steps = write_steps(iterations, case_steps if case_steps > 0 else None)
        if control != "timeStep" or steps != case_steps:
            cd["writeControl"] = "timeStep"
            cd["writeInterval"] = steps
    return TimeControl(tc.start, end, tc.delta_t)


def write_decompose_dict(case_dir: Path, n_ranks: int, method: str = "hierarchical") -> None:
    """An equal decomposition with a method every OpenFOAM build has."""
    path = case_dir / "system" / "decomposeParDict"
    if path.exists():
        path.unlink()
    body = {
        "numberOfSubdomains": n_ranks,
        "method": method,
    }
    text = (
        "FoamFile\n{\n    version 2.0;\n    format ascii;\n    class dictionary;\n"
        "    object decomposeParDict;\n}\n\n"
        f"numberOfSubdomains {body['numberOfSubdomains']};\n"
        f"method {body['method']};\n"
        f"{method}Coeffs\n{{\n    n ({n_ranks} 1 1);\n    order xyz;\n    delta 0.001;\n}}\n"
    )
    path.write_text(text)


def decompose(case_dir: Path) -> list[int]:
    """Run decomposePar; return the cells per processor as OpenFOAM counted them."""
    run_tool(case_dir, ["decomposePar", "-force"], "decomposePar")
    text = (case_dir / "log.decomposePar").read_text(errors="replace")
    counts = [int(x) for x in re.findall(r"Number of cells = (\d+)", text)]
    if not counts:
        raise UserError(f"decomposePar reported no processors; see {case_dir}/log.decomposePar")
    return counts


# -- this process's OpenFOAM ---------------------------------------------------------------


class _Here:
    """`foamtools.FoamTools` in this process's environment (`foam_env`): the tutorials at
    `EXAMPLES_ROOT`, the tools as subprocesses."""

    local_files = True
    fallback = None

    def which(self, program: str, cwd: Path | None = None) -> str | None:
        return shutil.which(program, path=foam_env().get("PATH"))

    def run(self, argv: Sequence[str], cwd: Path, log: BinaryIO) -> int:
        return foamtools.run_logged(argv, cwd=cwd, env=foam_env(), log=log)

    def listing(self, program: str) -> str:
        return mpiabi.listing_of(Path(program))

    def tutorials(self, name: str) -> Tutorials:
        missing = (f"OpenFOAM tutorials are not installed ({EXAMPLES_ROOT} missing); "
                   "apt-get install openfoam-examples, or give a case directory")  # fmt: skip
        if not EXAMPLES_ROOT.is_dir():
            return Tutorials(None, (), missing)
        known = KNOWN_TUTORIALS.get(name)
        if known and _is_case(EXAMPLES_ROOT / known):  # (no walk)
            return Tutorials(EXAMPLES_ROOT, (EXAMPLES_ROOT / known,), missing)
        found = {p.parent.parent for p in EXAMPLES_ROOT.glob(f"**/{name}/system/controlDict*")}
        return Tutorials(EXAMPLES_ROOT, tuple(sorted(found)), missing)

    def copy_tutorial(self, source: Path, dest: Path, bounds: CopyBounds) -> int:
        return _copy_here(CaseSource(source, source.name, tutorial=True), dest)


HERE: FoamTools = _Here()
"""This process's own OpenFOAM."""


def tools() -> FoamTools:
    """Where OpenFOAM runs for what is being done: `foamtools.current`, else `HERE`."""
    return foamtools.current() or HERE
