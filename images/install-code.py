"""Lay out rankpack's own code as it sits in an image: the CODE layer, above the base.

    python3 images/install-code.py --source CHECKOUT --root STAGE [--python 3.11]

writes under ``STAGE/opt/rankpack`` (the base image's venv, see install-rootfs.sh):

- ``lib/pythonX.Y/site-packages/rankpack/``: the package as a wheel of it holds it (the
  ``.py`` files of every package with an ``__init__.py``, and the package data that
  pyproject.toml's ``[tool.setuptools.package-data]`` names, among them the shim libraries
  ``_lib/*.so`` that ``make -C shim install`` built), byte-compiled when this Python is the
  image's;
- ``lib/pythonX.Y/site-packages/rankpack-VERSION.dist-info/``: metadata, entry points, RECORD;
- ``bin/rankpack``, ``bin/rankpack-exec``, ``bin/rankpack-launcher``: the console scripts of ``[project.scripts]``.

Both builds run this script, so the code in an image is the same whichever built it:
images/Containerfile (in its ``code`` stage) and `rankpack.devcluster.appimages` (on the
host, then ``umoci insert``). Standard library only; it does what ``pip install --no-deps``
of rankpack's wheel does, without a build backend (setuptools is not in the images and the
host's pip would write the host's interpreter into the scripts' ``#!`` line).
"""

from __future__ import annotations

import argparse
import base64
import compileall
import hashlib
import os
import py_compile
import shutil
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

PREFIX = "/opt/rankpack"
SKIP_DIRS = frozenset({"__pycache__"})


@dataclass(frozen=True)
class Project:
    """What pyproject.toml says about the distribution."""

    name: str
    version: str
    requires_python: str
    dependencies: tuple[str, ...]
    scripts: dict[str, str]
    package_data: dict[str, tuple[str, ...]]

    @classmethod
    def read(cls, pyproject: Path) -> Project:
        with open(pyproject, "rb") as f:
            data = tomllib.load(f)
        project = data["project"]
        setuptools = data.get("tool", {}).get("setuptools", {})
        return cls(
            name=project["name"],
            version=project["version"],
            requires_python=project.get("requires-python", ""),
            dependencies=tuple(project.get("dependencies", ())),
            scripts=dict(project.get("scripts", {})),
            package_data={k: tuple(v) for k, v in setuptools.get("package-data", {}).items()},
        )


def package_files(src: Path, top: str, package_data: dict[str, tuple[str, ...]]) -> list[Path]:
    """Files of package ``top`` under ``src`` (relative to ``src``), sorted: what setuptools'
    ``packages.find`` + ``package-data`` put in the wheel."""
    root = src / top
    files: set[Path] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        here = Path(dirpath)
        # A directory without __init__.py is no package (and neither is anything below it).
        if not (here / "__init__.py").is_file():
            dirnames[:] = []
            continue
        files.update((here / f).relative_to(src) for f in filenames if f.endswith(".py"))
    for pattern in package_data.get(top, ()):
        for path in root.glob(pattern):
            if path.is_file() and not SKIP_DIRS.intersection(path.relative_to(root).parts):
                files.add(path.relative_to(src))
    return sorted(files)


def script_text(entry_point: str, prefix: str = PREFIX) -> str:
    """A console script for ``module:attr`` whose ``#!`` is the image's venv python."""
    module, _, attr = entry_point.partition(":")
    head, _, rest = attr.partition(".")
    call = head + (f".{rest}" if rest else "")
    return (
        f"#!{prefix}/bin/python\n"
        "import sys\n"
        f"from {module} import {head}\n\n"
        'if __name__ == "__main__":\n'
        f"    sys.exit({call}())\n"
    )


def metadata_text(project: Project) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {project.name}", f"Version: {project.version}"]
    if project.requires_python:
        lines.append(f"Requires-Python: {project.requires_python}")
    lines += [f"Requires-Dist: {dep}" for dep in project.dependencies]
    return "\n".join(lines) + "\n"


def entry_points_text(project: Project) -> str:
    lines = ["[console_scripts]"] + [f"{k} = {v}" for k, v in sorted(project.scripts.items())]
    return "\n".join(lines) + "\n"


def _record_hash(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def install(source: Path, root: Path, python: str, prefix: str = PREFIX) -> Path:
    """Write the code layer under ``root``; returns ``root / prefix``."""
    project = Project.read(source / "pyproject.toml")
    top = project.name.replace("-", "_")
    venv = root / prefix.lstrip("/")
    site = venv / "lib" / f"python{python}" / "site-packages"
    written: list[Path] = []
    for rel in package_files(source / "src", top, project.package_data):
        dest = site / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / "src" / rel, dest)
        dest.chmod(0o755 if os.access(source / "src" / rel, os.X_OK) else 0o644)
        written.append(dest)
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == python:
        # Hash-checked .pyc: valid whatever mtimes the layer's tar gives the sources.
        compileall.compile_dir(
            site / top,
            quiet=2,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )
        written += sorted((site / top).rglob("*.pyc"))
    bin_dir = venv / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, entry_point in sorted(project.scripts.items()):
        script = bin_dir / name
        script.write_text(script_text(entry_point, prefix))
        script.chmod(0o755)
        written.append(script)
    dist_info = site / f"{top}-{project.version}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("METADATA", metadata_text(project)),
        ("entry_points.txt", entry_points_text(project)),
        ("top_level.txt", top + "\n"),
        ("INSTALLER", "rankpack-images\n"),
    ):
        (dist_info / name).write_text(text)
        written.append(dist_info / name)
    record = dist_info / "RECORD"
    rows = [f"{os.path.relpath(p, site)},{_record_hash(p)},{p.stat().st_size}" for p in written]
    rows.append(f"{os.path.relpath(record, site)},,")
    record.write_text("\n".join(rows) + "\n")
    for d in [venv, *(p for p in venv.rglob("*") if p.is_dir())]:
        d.chmod(0o755)
    return venv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="the rankpack checkout")
    parser.add_argument("--root", type=Path, required=True, help="where to write opt/rankpack")
    parser.add_argument(
        "--python",
        default=f"{sys.version_info[0]}.{sys.version_info[1]}",
        help="the image's Python X.Y (default: this one's)",
    )
    args = parser.parse_args(argv)
    if not (args.source / "pyproject.toml").is_file():
        parser.error(f"{args.source} has no pyproject.toml: not a rankpack checkout")
    install(args.source.resolve(), args.root, args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
