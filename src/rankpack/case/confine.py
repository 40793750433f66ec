"""Confined staging: a case from someone with fewer rights than the stager runs no code of
its own and reads no file outside itself while it is copied, meshed and decomposed.

OpenFOAM dictionaries can run programs while they are read: ``#codeStream`` and ``#calc``
compile and load C++ from the dictionary, ``coded*`` boundary conditions, function objects
and fvOptions do the same when a tool builds them, a ``systemCall`` function object runs
shell commands, and ``InfoSwitches { allowSystemOperations 1; }`` in the case's own
controlDict turns back on what the installation turned off. ``#include`` pulls in any file
(a ServiceAccount token, another user's case), which may then be echoed into logs, Events
and status. A case's ``Allrun`` names the programs rankpack runs to mesh it; a ``libs``
entry with a path loads a shared object of the case's choosing. A symlink in the case
makes the copy read whatever it points at.

The operator stages every Simulation *confined*: `check_link` in the walk before the copy
(symlinks that leave the case), `scan` on the copy before any OpenFOAM tool reads it (directives,
includes, ``libs``) and `check_steps` on the meshing commands. The scan is the protection:
OpenFOAM's own switch does not help, measured on Debian's v1912 as a non-root user
(``blockMesh -info-switch allowSystemOperations=0`` on a case with ``#codeStream`` still
execs ``wmake``), and Debian's OpenFOAM refuses ``#codeStream`` only when run as root.
Local runs (`rankpack run`) stage the user's own case with the user's own rights and are
not confined.

Refusals are `CaseNotConfined` (a `UserError`): the file, the line and what to change.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rankpack.errors import UserError

MESH_UTILITIES = frozenset(
    {
        "blockMesh",
        "snappyHexMesh",
        "surfaceFeatureExtract",
        "surfaceFeatures",
        "topoSet",
        "setFields",
        "setExprFields",
        "createPatch",
        "createBaffles",
        "mergeOrSplitBaffles",
        "checkMesh",
        "subsetMesh",
        "refineMesh",
        "refineHexMesh",
        "renumberMesh",
        "extrudeMesh",
        "extrude2DMesh",
        "extrudeToRegionMesh",
        "splitMeshRegions",
        "mapFields",
        "changeDictionary",
        "transformPoints",
        "surfaceTransformPoints",
        "stitchMesh",
        "mirrorMesh",
        "mergeMeshes",
        "polyDualMesh",
        "collapseEdges",
        "PDRblockMesh",
        "PDRsetFields",
        "potentialFoam",
    }
)
"""The OpenFOAM utilities a confined staging may run from a case's Allrun to make its mesh
and initial fields. Anything else (a shell, a script of the case, a solver) is refused."""

_TEXT_LIMIT = 4 << 20
"""Files up to this size are read as text with comments removed; larger ones (mesh data)
are searched as bytes for directives at a token boundary."""

_SKIPPED_TOP = ("processor", "log.", "Allrun", "Allclean", "Allprepare", "README")
"""Top-level entries OpenFOAM does not parse as dictionaries during staging."""

_CODE = re.compile(
    r"(?:^|(?<=\s))(#codeStream|#calc)\b"
    r"|\btype\s+\"?(\w*[cC]oded\w*|systemCall)\b"
    r"|\b(allowSystemOperations)\b",
    re.MULTILINE,
)
_CODE_BYTES = re.compile(_CODE.pattern.encode(), re.MULTILINE)
_INCLUDE = re.compile(
    r"(?:^|(?<=\s))#(include|sinclude|includeIfPresent|includeEtc|includeFunc|includeModel)\b"
    r"[ \t]*(\"[^\"\n]*\"|\S+)?",
    re.MULTILINE,
)
_LIBS = re.compile(r"\blibs\s*\(([^)]*)\)")
_CASE_TAGS = ("$FOAM_CASE", "${FOAM_CASE}", "<case>")
_DIR_TAGS = {"<system>": "system", "<constant>": "constant"}


class CaseNotConfined(UserError):
    """The case asks for something a confined staging does not do (code, a file outside)."""


@dataclass(frozen=True)
class Finding:
    path: Path
    line: int
    what: str


def check_link(root: Path, link: Path, target: Path) -> None:
    """No symlink in the case may point outside it (the copy follows links): the
    ``on_link`` of the walk before the copy (`rankpack.paths.check_tree`)."""
    top = root.resolve()
    if not _inside(target, top):
        raise CaseNotConfined(
            f"{link.relative_to(root)} in case {root} is a link to {target}, outside "
            "the case; copy the file into the case instead"
        )


def scan(case_dir: Path) -> list[Finding]:
    """Everything in the (copied) case that a confined staging refuses, in file order."""
    top = case_dir.resolve()
    found: list[Finding] = []
    for path in _dictionaries(top):
        found.extend(_scan_file(path, top))
    return found


def check_case(case_dir: Path) -> None:
    """`scan`, raising `CaseNotConfined` naming the first finding (and how many more)."""
    found = scan(case_dir)
    if found:
        first = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        rel = first.path.relative_to(case_dir.resolve())
        raise CaseNotConfined(
            f"{rel}:{first.line}: {first.what}{more}; the operator stages cases without "
            "running their code or reading files outside them: remove it, or run the case "
            "with your own rights (rankpack run)"
        )


def check_steps(steps: Sequence[Sequence[str]], case_dir: Path) -> None:
    """The Allrun's meshing commands: OpenFOAM mesh utilities only, arguments in the case."""
    top = case_dir.resolve()
    for argv in steps:
        if not argv or argv[0] not in MESH_UTILITIES:
            name = argv[0] if argv else "(empty)"
            raise CaseNotConfined(
                f"the case's Allrun runs {name!r} to make its mesh; the operator runs only "
                f"OpenFOAM mesh utilities ({', '.join(sorted(MESH_UTILITIES)[:6])}, ...): "
                "mesh the case before submitting it, or use blockMesh"
            )
        for arg in argv[1:]:
            if arg in ("-case", "-lib", "-libs") or arg.startswith(("-case=", "-lib")):
                raise CaseNotConfined(
                    f"the case's Allrun gives {argv[0]} {arg}; confined staging runs tools "
                    "in the case with no extra libraries: remove the option"
                )
            if ("/" in arg or arg.startswith(("~", "$"))) and not _inside(
                _resolve_arg(arg, top), top
            ):
                raise CaseNotConfined(
                    f"the case's Allrun gives {argv[0]} the path {arg}, outside the case; "
                    "name files of the case only"
                )


def _resolve_arg(arg: str, top: Path) -> Path:
    if arg.startswith(("~", "$")):
        return Path("/")  # outside, whatever it expands to
    return (top / arg).resolve()


def _dictionaries(top: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        here = Path(dirpath)
        if here == top:
            dirnames[:] = [d for d in dirnames if not d.startswith(_SKIPPED_TOP)]
            filenames = [f for f in filenames if not f.startswith(_SKIPPED_TOP)]
        dirnames.sort()
        for name in sorted(filenames):
            path = here / name
            if path.is_file() and not path.is_symlink():
                yield path


def _scan_file(path: Path, top: Path) -> Iterator[Finding]:
    size = path.stat().st_size
    if size > _TEXT_LIMIT:
        yield from _scan_bytes(path)
        return
    text = _strip_comments(path.read_bytes().decode("latin-1"))
    for m in _CODE.finditer(text):
        word = next(g for g in m.groups() if g)
        yield Finding(path, _line(text, m.start()), _describe(word))
    for m in _INCLUDE.finditer(text):
        problem = _include_problem(m.group(1), (m.group(2) or "").strip('"'), path, top)
        if problem:
            yield Finding(path, _line(text, m.start()), problem)
    for m in _LIBS.finditer(text):
        for lib in m.group(1).replace('"', " ").split():
            if "/" in lib or lib.startswith(("$", "~", "<")):
                yield Finding(
                    path, _line(text, m.start()), f"libs names {lib!r}, a file of its own"
                )


def _scan_bytes(path: Path) -> Iterator[Finding]:
    """A large file, read in bounded chunks (with an overlap for a match across chunks)."""
    overlap, chunk = 256, 1 << 20
    with open(path, "rb") as fh:
        tail, lines = b"", 1
        while block := fh.read(chunk):
            data = tail + block
            for m in _CODE_BYTES.finditer(data):
                if m.end() <= len(tail):
                    continue  # seen in the previous chunk
                word = next(g for g in m.groups() if g).decode("latin-1")
                yield Finding(path, lines + data.count(b"\n", 0, m.start()), _describe(word))
            lines += data.count(b"\n", 0, len(data) - min(overlap, len(data)))
            tail = data[-overlap:]


def _describe(word: str) -> str:
    if word.startswith("#"):
        return f"{word} compiles and runs code while the dictionary is read"
    if word == "systemCall":
        return "a systemCall function object runs shell commands"
    if word == "allowSystemOperations":
        return "allowSystemOperations would turn system operations back on"
    return f"type {word} compiles and runs code of the case"


def _include_problem(kind: str, target: str, path: Path, top: Path) -> str | None:
    if kind in ("includeEtc", "includeFunc", "includeModel"):
        # resolved in OpenFOAM's own etc directories, by name
        if "/.." in f"/{target}" or target.startswith(("/", "$", "~")):
            return f"#{kind} {target!r} names a path; give an installed name"
        return None
    if not target:
        return f"#{kind} without a file name"
    for tag in _CASE_TAGS:
        if target.startswith(tag):
            return _outside(top / target[len(tag) :].lstrip("/"), top, kind, target)
    for tag, sub in _DIR_TAGS.items():
        if target.startswith(tag):
            return _outside(top / sub / target[len(tag) :].lstrip("/"), top, kind, target)
    if target.startswith(("$", "~", "<")):
        return f"#{kind} {target!r}: includes may name files of the case only"
    base = Path(target) if target.startswith("/") else path.parent / target
    return _outside(base, top, kind, target)


def _outside(candidate: Path, top: Path, kind: str, target: str) -> str | None:
    if _inside(candidate.resolve(), top):
        return None
    return f"#{kind} {target!r} reads a file outside the case"


def _inside(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', re.DOTALL)


def _strip_comments(text: str) -> str:
    """Comments blanked (newlines kept, so line numbers hold); strings left as they are."""

    def blank(m: re.Match[str]) -> str:
        s = m.group(0)
        return s if s.startswith('"') else re.sub(r"[^\n]", " ", s)

    return _COMMENT.sub(blank, text)
