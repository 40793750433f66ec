"""The house keeps its shape: sizes, unique names and package docstrings over all of src/rankpack.

A fitness test (docs/architecture.md, "Rooms stay small"): it fails the day a room regrows,
not at the next review. The limits: no file over `FILE_MAX_LINES` lines, no class over
`CLASS_MAX_LINES`, no function or method over `FUNCTION_MAX_LINES` (an ast node's
``end_lineno - lineno + 1``; a file's count of newlines); no two classes of one name; every
module of a package named in the package's docstring, and every module a docstring names
(a dotted ``rankpack.x.y`` path, or ``name.py`` in a package's docstring) exists.

`EXCEPTIONS` lists at most `MAX_EXCEPTIONS` offenders, each with its reason; the rooms the
cut of the Kubernetes wing was for (`NEVER_EXCEPTED`) can never be listed. The checker proves
itself on made-up packages (``test_checker_*``).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "rankpack"

FILE_MAX_LINES = 600
CLASS_MAX_LINES = 350
FUNCTION_MAX_LINES = 80
MAX_EXCEPTIONS = 3

# "kind path[:qualified name]" -> why it may stay over its limit.
EXCEPTIONS: dict[str, str] = {}

NEVER_EXCEPTED = frozenset(
    {
        "file operator/queue.py",
        "file devcluster/cluster.py",
        "file backend/kubernetes/backend.py",
        "class operator/queue.py:SimulationQueue",
        "class backend/kubernetes/backend.py:KubernetesBackend",
    }
)
NEVER_EXCEPTED_CLASSES = frozenset({"SimulationQueue", "KubernetesBackend"})

# Dotted names that are not modules: the API group of the Simulation resource.
NOT_MODULES = frozenset({"rankpack.dev"})
_DOTTED = re.compile(r"\brankpack(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?![\w/])")
_FILE_NAME = re.compile(r"(?<![\w/.])([A-Za-z_][A-Za-z0-9_]*)\.py\b")


@dataclass(frozen=True)
class Finding:
    """One breach of the house rules: ``key`` names it as `EXCEPTIONS` would."""

    key: str
    detail: str


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def size_findings(root: Path) -> list[Finding]:
    """Files, classes and functions over their limits."""
    found: list[Finding] = []
    for path in _modules(root):
        text = path.read_text()
        rel = _rel(root, path)
        lines = text.count("\n")
        if lines > FILE_MAX_LINES:
            found.append(Finding(f"file {rel}", f"{lines} lines > {FILE_MAX_LINES}"))
        found.extend(_node_findings(rel, ast.parse(text), prefix=""))
    return found


def _node_findings(rel: str, node: ast.AST, prefix: str) -> list[Finding]:
    found: list[Finding] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{child.name}"
            length = (child.end_lineno or child.lineno) - child.lineno + 1
            is_class = isinstance(child, ast.ClassDef)
            limit = CLASS_MAX_LINES if is_class else FUNCTION_MAX_LINES
            kind = "class" if is_class else "function"
            if length > limit:
                found.append(Finding(f"{kind} {rel}:{name}", f"{length} lines > {limit}"))
            found.extend(_node_findings(rel, child, prefix=f"{name}."))
        else:
            found.extend(_node_findings(rel, child, prefix))
    return found


def duplicate_classes(root: Path) -> dict[str, list[str]]:
    """Class names defined more than once anywhere under ``root`` (nested classes too)."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in _modules(root):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{_rel(root, path)}:{node.lineno}")
    return {name: places for name, places in where.items() if len(places) > 1}


def _children(package: Path) -> list[str]:
    names = []
    for child in sorted(package.iterdir()):
        if child.is_dir() and (child / "__init__.py").exists():
            names.append(child.name)
        elif child.suffix == ".py" and child.name != "__init__.py":
            names.append(child.stem)
    return names


def _exists(root: Path, dotted: str) -> bool:
    """A ``rankpack.a.b`` path names a module, a package, or a name defined in a module."""
    parts = dotted.split(".")[1:]
    for cut in range(len(parts), -1, -1):
        base = root.joinpath(*parts[:cut]) if cut else root
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if not module.exists():
            continue
        rest = parts[cut:]
        if not rest:
            return True
        return _defines(module, rest[0])
    return False


def _defines(module: Path, name: str) -> bool:
    if (module.parent / name).is_dir() or (module.parent / f"{name}.py").exists():
        return module.name == "__init__.py"
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        elif isinstance(node, ast.ImportFrom | ast.Import) and any(
            (alias.asname or alias.name) == name for alias in node.names
        ):
            return True
    return False


def docstring_findings(root: Path) -> list[Finding]:
    """Modules a package's docstring leaves out, and docstrings naming modules that don't exist."""
    found: list[Finding] = []
    for path in _modules(root):
        rel = _rel(root, path)
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        for dotted in sorted(set(_DOTTED.findall(doc)) - NOT_MODULES):
            if not _exists(root, dotted):
                found.append(Finding(f"docstring {rel}", f"names {dotted}, which does not exist"))
        if path.name != "__init__.py":
            continue
        package = path.parent
        children = _children(package)
        for name in children:
            if not re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", doc):
                found.append(Finding(f"docstring {rel}", f"does not name its module {name}"))
        for name in sorted(set(_FILE_NAME.findall(doc))):
            if name not in children:
                found.append(Finding(f"docstring {rel}", f"names {name}.py, which does not exist"))
    return found


def _breaches(findings: list[Finding]) -> list[str]:
    return [f"{f.key}: {f.detail}" for f in findings if f.key not in EXCEPTIONS]


def test_exceptions_are_few_and_never_the_rooms_that_were_cut() -> None:
    assert len(EXCEPTIONS) <= MAX_EXCEPTIONS, sorted(EXCEPTIONS)
    assert not NEVER_EXCEPTED & EXCEPTIONS.keys()
    for key, reason in EXCEPTIONS.items():
        assert not any(key.endswith(f":{name}") for name in NEVER_EXCEPTED_CLASSES), key
        assert reason.strip(), f"{key} is listed without a reason"


def test_exceptions_are_still_needed() -> None:
    keys = {f.key for f in size_findings(SRC)}
    stale = sorted(set(EXCEPTIONS) - keys)
    assert not stale, f"listed as exceptions but within the limits now; remove them: {stale}"


def test_no_room_over_its_size() -> None:
    breaches = _breaches(size_findings(SRC))
    assert not breaches, "cut these along their seams:\n" + "\n".join(breaches)


def test_every_class_name_is_defined_once() -> None:
    duplicates = duplicate_classes(SRC)
    assert not duplicates, f"rename one of each: {duplicates}"


def test_package_docstrings_name_their_modules_and_only_real_ones() -> None:
    breaches = _breaches(docstring_findings(SRC))
    assert not breaches, "\n".join(breaches)


# The checker proves itself on made-up packages.


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "rankpack"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checker_finds_a_601_line_file_and_passes_600(tmp_path: Path) -> None:
    over = _package(tmp_path / "a", {"__init__.py": '"""big"""\n', "big.py": "x = 1\n" * 601})
    at = _package(tmp_path / "b", {"__init__.py": '"""big"""\n', "big.py": "x = 1\n" * 600})
    assert [f.key for f in size_findings(over)] == ["file big.py"]
    assert size_findings(at) == []


@pytest.mark.parametrize(
    ("body_lines", "kind"), [(CLASS_MAX_LINES, "class"), (FUNCTION_MAX_LINES, "function")]
)
def test_checker_finds_a_long_class_and_function(
    tmp_path: Path, body_lines: int, kind: str
) -> None:
    head = "class Big:\n" if kind == "class" else "def big() -> None:\n"
    text = head + "    x = 1\n" * body_lines  # header + body: one line over the limit
    root = _package(tmp_path, {"__init__.py": '"""m"""\n', "m.py": text})
    found = [f.key for f in size_findings(root)]
    name = "Big" if kind == "class" else "big"
    assert found == [f"{kind} m.py:{name}"]
    one_less = text[: -len("    x = 1\n")]
    shorter = _package(tmp_path / "s", {"__init__.py": '"""m"""\n', "m.py": one_less})
    assert size_findings(shorter) == []


def test_checker_finds_a_long_method(tmp_path: Path) -> None:
    text = "class Small:\n    def long(self) -> None:\n" + "        x = 1\n" * FUNCTION_MAX_LINES
    root = _package(tmp_path, {"__init__.py": '"""m"""\n', "m.py": text})
    assert [f.key for f in size_findings(root)] == ["function m.py:Small.long"]


def test_checker_finds_a_class_name_defined_twice(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "__init__.py": '"""a, b"""\n',
            "a.py": "class Reading: ...\n",
            "b.py": "class Reading: ...\n",
        },
    )
    assert duplicate_classes(root) == {"Reading": ["a.py:1", "b.py:1"]}


def test_checker_finds_docstrings_that_miss_or_invent_modules(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "__init__.py": '"""Holds `a` and gone.py; see rankpack.a.thing, rankpack.nope."""\n',
            "a.py": '"""A."""\nthing = 1\n',
            "b.py": '"""B."""\n',
        },
    )
    details = sorted(f.detail for f in docstring_findings(root))
    assert details == [
        "does not name its module b",
        "names gone.py, which does not exist",
        "names rankpack.nope, which does not exist",
    ]
