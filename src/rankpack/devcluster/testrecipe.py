"""What the test images are made of: pure values and functions, no side effects.

Used by `rankpack.devcluster.testimages`, which builds and caches them. Each is a Simulation
image as a team would bring one (issue 41), made from Debian's packages with nothing of
rankpack in it:

- ``openfoam-trixie``: Debian 13's OpenFOAM (v1912, linked against Open MPI 5.0, whose
  launcher starts its daemons through PRRTE) and its tutorials;
- ``mpich-rankloop``: Debian 13's MPICH (4.2: Debian 12's 4.0.2 now and then hangs in
  ``MPI_Finalize``, pmodels/mpich#6596) and ``rankloop`` (``images/testimages/rankloop.c``),
  a program that is not OpenFOAM, compiled against that MPICH in the image's build;
- ``serial-rankloop``: Debian 12 and ``rankloop-serial``, the same program linking no MPI:
  the solver rankpack must refuse (``UnsupportedMPI``).

`RECIPES` lists them; `recipe_key` is each one's cache key, `recipe_ref` its reference,
`suite_sources` its apt sources (this host's Debian mirror, for the image's suite), and
`mmdebstrap_argv` the one command that makes its root filesystem: a ``minbase`` Debian with
the image's packages and, for a program built in it, its build packages, which are purged
again once the program is compiled.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rankpack.devcluster.imagerecipe import FOAM_ENV, apt_sources
from rankpack.errors import UserError

RECIPE = "test-images-1"
"""Part of every key: change it when the build (`mmdebstrap_argv`, the layer, the config)
changes what an image holds."""
REGISTRY = "rankpack.test"
"""The images' name prefix (what an operator's ``--allow-image`` names for them)."""
SOURCES = "images/testimages"
"""The checkout's directory of the programs built in the images."""
IN_ROOTFS = "/tmp/rankpack-test-images"
"""Where the sources are copied in the root filesystem for the build (removed after)."""
USER = "1000:1000"
"""The images' user: numeric and not root, with no entry in /etc/passwd (own-image.md's
contract asks for no more)."""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SUITES = {"bookworm": "12", "trixie": "13"}
"""The Debian suites a test image may be made of, with their versions."""


@dataclass(frozen=True)
class Recipe:
    """One test image: what it is made of, and what a Simulation runs in it."""

    name: str
    suite: str
    packages: tuple[str, ...]
    """Debian packages that stay in the image (no Recommends)."""
    solver: str
    """The program a Simulation of this image runs (``spec.solver`` or the case's own)."""
    mpi: str | None
    """The MPI ABI family the solver links (`rankpack.case.mpiabi`); None: none."""
    build_packages: tuple[str, ...] = ()
    """Installed for `builds` only, then purged with what they pulled in."""
    builds: tuple[tuple[str, ...], ...] = ()
    """Commands run in the root filesystem, in `IN_ROOTFS` (the sources), after the
    packages are installed."""
    env: tuple[tuple[str, str], ...] = ()
    """The image config's environment, after PATH (Debian's OpenFOAM: where its ``etc/``
    and its Open MPI build of libPstream are, as a team's image would set them)."""
    about: str = ""


RANKLOOP_FLAGS = ("-O2", "-Wall", "-Wextra", "-Werror")

RECIPES = (
    Recipe(
        "openfoam-trixie",
        "trixie",
        ("openfoam", "openfoam-examples", "openmpi-bin"),
        solver="simpleFoam",
        mpi="openmpi",
        env=FOAM_ENV,
        about="Debian 13's OpenFOAM v1912 and tutorials, Open MPI 5",
    ),
    Recipe(
        "mpich-rankloop",
        "trixie",
        ("mpich",),
        solver="rankloop",
        mpi="mpich",
        build_packages=("libmpich-dev", "gcc", "libc6-dev"),
        builds=(("mpicc.mpich", *RANKLOOP_FLAGS, "-o", "/usr/local/bin/rankloop", "rankloop.c"),),
        about="Debian 13's MPICH 4.2 and rankloop built against it",
    ),
    Recipe(
        "serial-rankloop",
        "bookworm",
        (),
        solver="rankloop-serial",
        mpi=None,
        build_packages=("gcc", "libc6-dev"),
        builds=(
            (
                "gcc",
                *RANKLOOP_FLAGS,
                "-DRANKLOOP_SERIAL",
                "-o",
                "/usr/local/bin/rankloop-serial",
                "rankloop.c",
            ),
        ),
        about="Debian 12 and rankloop-serial, linking no MPI",
    ),
)


def recipe(name: str) -> Recipe:
    for image in RECIPES:
        if image.name == name:
            return image
    names = ", ".join(i.name for i in RECIPES)
    raise UserError(f"no test image {name[:80]!r}: the test images are {names}")


def source_files(source_root: Path) -> list[Path]:
    """The files of `SOURCES` (copied into every build; part of every key), sorted."""
    root = source_root / SOURCES
    if not root.is_dir():
        raise UserError(f"{source_root} is not a rankpack checkout with {SOURCES}/")
    return sorted(p for p in root.rglob("*") if p.is_file())


def recipe_key(source_root: Path, image: Recipe) -> str:
    """Hash of what the image holds: the recipe, the image's fields (suite, packages,
    builds, environment), the sources and the dpkg path filters (``images/dpkg.cfg``)."""
    described: dict[str, object] = {"recipe": RECIPE, "image": asdict(image)}
    files = {}
    try:
        for path in [*source_files(source_root), source_root / "images" / "dpkg.cfg"]:
            rel = str(path.relative_to(source_root))
            files[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise UserError(f"cannot read the test images' sources: {exc}") from exc
    described["files"] = files
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def recipe_ref(image: Recipe, key: str) -> str:
    """``rankpack.test/NAME:KEY12``: a new key is a new tag (a node keeps both)."""
    return f"{REGISTRY}/{image.name}:{key[:12]}"


def suite_sources(host_files: Mapping[str, str], host_suite: str, suite: str) -> str:
    """A deb822 sources file for ``suite`` on this host's Debian mirror: the host's entries
    for ``host_suite`` (`imagerecipe.apt_sources`), each suite renamed (bookworm-security
    -> trixie-security). Empty if the host has none."""
    text = apt_sources(host_files, host_suite)
    if suite == host_suite:
        return text
    out = []
    for line in text.splitlines():
        if line.startswith("Suites:"):
            names = line.split(":", 1)[1].split()
            line = "Suites: " + " ".join(suite + n[len(host_suite) :] for n in names)
        out.append(line)
    return "\n".join(out) + ("\n" if out else "")


def config_env(image: Recipe) -> tuple[tuple[str, str], ...]:
    return (("PATH", PATH), *image.env)


def mmdebstrap_argv(image: Recipe, inputs: Path, sources: Path, dpkg_cfg: Path) -> list[str]:
    """mmdebstrap writing the image's root filesystem as a tar to stdout."""
    hooks = [f'mkdir -p "$1"{IN_ROOTFS} && cp -a {shlex.quote(str(inputs))}/. "$1"{IN_ROOTFS}/']
    for command in image.builds:
        line = f"cd {IN_ROOTFS} && {shlex.join(command)}"
        hooks.append(f'chroot "$1" sh -c {shlex.quote(line)}')
    if image.build_packages:
        purge = ["apt-get", "purge", "-y", "-qq", "--autoremove", *image.build_packages]
        hooks.append(f'chroot "$1" env DEBIAN_FRONTEND=noninteractive {shlex.join(purge)}')
    # No build input, host name, resolver or mmdebstrap's own configuration stays.
    hooks.append(
        f'rm -rf "$1"{IN_ROOTFS} "$1"/etc/resolv.conf "$1"/etc/hostname'
        ' "$1"/etc/dpkg/dpkg.cfg.d/99mmdebstrap "$1"/etc/apt/apt.conf.d/99mmdebstrap'
        ' "$1"/var/cache/apt/*.bin "$1"/var/lib/apt/lists/*'
    )
    argv = [
        "mmdebstrap",
        "--mode=root",
        "--variant=minbase",
        "--format=tar",
        "--aptopt=APT::Install-Recommends false",
        f"--dpkgopt={dpkg_cfg}",
    ]
    packages = [*image.packages, *image.build_packages]
    if packages:
        argv.append(f"--include={','.join(packages)}")
    argv += [f"--customize-hook={hook}" for hook in hooks]
    return [*argv, image.suite, "-", str(sources)]


def describe(images: Sequence[Recipe]) -> str:
    """One line per image: name, suite, solver, MPI, what it is."""
    return "\n".join(
        f"{i.name:16} Debian {SUITES.get(i.suite, i.suite):3} {i.solver:16} "
        f"{i.mpi or 'no MPI':8} {i.about}"
        for i in images
    )
