"""rankpack's two container images, built on this machine without a container engine.

Called by `rankpack dev-cluster images` (`rankpack.cli.devcluster_cmd`), by
``python -m rankpack.devcluster.appimages`` (`setup.sh test`, so CI builds them at most
once per machine) and by ``rankpack dev-cluster up --operator`` (`ensure_images`, then
`import_images` into the cluster's containerd).

- ``rankpack.local/rankpack:dev``: Debian 12 + the venv /opt/rankpack (Debian's Python 3.11,
  rankpack and its dependencies): the operator and the node agent;
- ``rankpack.local/rank:dev``: the same plus OpenFOAM, Open MPI and MPICH: rank pods and
  launcher pods.

Both run as uid/gid 1000 (user ``rankpack``). Each is two layers, cached apart:

- the BASE (`applayers.build_base`): ``mmdebstrap`` makes a Debian root filesystem with the
  packages of ``images/packages/*.txt`` and runs ``images/install-rootfs.sh`` in it (the
  same script ``images/Containerfile`` runs), ``umoci raw add-layer`` makes it a layer.
  Minutes, once per `base_key`: the package lists, the script, its dpkg filters, the
  dependency list of pyproject.toml and the Debian suite;
- the CODE (`applayers.build_code`): the shim built by ``make -C shim install`` on this host (Debian
  12, the image's ABI) and ``images/install-code.py``'s layout of rankpack in the venv,
  added with ``umoci insert``. Seconds, once per `code_key` (src/, shim/, pyproject.toml).

Cache (``$RANKPACK_CACHE/images``, default /var/cache/rankpack/images)::

    base/<target>-<base key>/{oci/, base.json}                the base, tag "base"
    dev/<target>-<base key>-<code key>/{image.tar, image.json} the image, tag "dev"

Everything is built in a ``.tmp-*`` sibling and renamed into place, so an interrupted build
leaves no half cache; a lock file serializes builds. This module keys, caches and prunes
them; the build steps are `rankpack.devcluster.applayers`; what the images are made of
(targets, keys, config, the mmdebstrap command) is `rankpack.devcluster.imagerecipe`, pure.

Apt sources are this host's apt entries for the suite (they stay in the image, as a
Debian image's own would). pip uses its default index, or the host's ``PIP_INDEX_URL`` and
proxy variables, and trusts the host's CA bundle during the build (a site's TLS-inspecting
proxy); neither those variables nor the bundle stay in the image.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rankpack.devcluster.applayers import assemble, build_base, build_code
from rankpack.devcluster.binaries import CACHE_ROOT
from rankpack.devcluster.imagerecipe import (
    SUITE,
    TARGETS,
    Target,
    base_key,
    code_key,
    image_config,
)
from rankpack.devcluster.images import add_to_every_node
from rankpack.devcluster.layout import Layout
from rankpack.devcluster.packages import tool
from rankpack.errors import UserError

__all__ = [
    "BuiltImage",
    "ImageSet",
    "ensure_images",
    "find_source_root",
    "import_images",
    "main",
]

# -- results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltImage:
    """One image archive (an OCI layout in a tar, what ``ctr images import`` reads)."""

    target: str
    ref: str
    archive: Path
    archive_bytes: int
    unpacked_bytes: int
    """Sum of the file sizes in its layers (what it takes unpacked, roughly)."""
    base_key: str
    code_key: str
    base_built: bool
    """This call built the base (minutes); False: it came from the cache."""
    image_built: bool
    """This call added the code layer (seconds); False: the whole image was cached."""
    base_s: float
    """Seconds the base took: to build now, or (cached) when it was built."""
    seconds: float
    """Seconds this call spent on this image."""

    @property
    def cached(self) -> bool:
        return not self.base_built and not self.image_built

    def as_json(self) -> dict[str, object]:
        data = asdict(self)
        data["archive"] = str(self.archive)
        data["cached"] = self.cached
        return data


@dataclass(frozen=True)
class ImageSet:
    images: tuple[BuiltImage, ...]
    seconds: float

    def get(self, name: str) -> BuiltImage:
        for image in self.images:
            if image.target == name:
                return image
        raise KeyError(name)

    @property
    def rankpack(self) -> BuiltImage:
        return self.get("rankpack")

    @property
    def rank(self) -> BuiltImage:
        return self.get("rank")

    def as_json(self) -> dict[str, object]:
        return {"images": [i.as_json() for i in self.images], "seconds": round(self.seconds, 2)}


# -- the cache -----------------------------------------------------------------------------


def images_cache(cache_root: Path = CACHE_ROOT) -> Path:
    return cache_root / "images"


def _is_checkout(path: Path) -> bool:
    return (path / "images" / "install-rootfs.sh").is_file() and (path / "pyproject.toml").is_file()


def find_source_root(explicit: Path | None = None, module: Path = Path(__file__)) -> Path:
    """The checkout to build from: ``explicit`` (``--source``), else the one this rankpack
    runs from (its images/, shim/ and src/ are the build's inputs)."""
    if explicit is not None:
        if not _is_checkout(explicit):
            raise UserError(
                f"--source {str(explicit)[:200]!r} is not a rankpack checkout "
                "(no images/install-rootfs.sh or pyproject.toml)"
            )
        return explicit.resolve()
    for candidate in module.resolve().parents:
        if _is_checkout(candidate):
            return candidate
    raise UserError(
        "the images are built from a rankpack checkout (images/, shim/, src/), and this "
        f"rankpack runs from {module.resolve().parent}: give the checkout with --source DIR"
    )


def _check_host() -> None:
    if os.geteuid() != 0:
        raise UserError("building the images needs root (mmdebstrap, chroot): run as root")
    missing = [
        pkg
        for pkg, exe in (
            ("mmdebstrap", "mmdebstrap"),
            ("umoci", "umoci"),
            ("make", "make"),
            ("libopenmpi-dev", "mpicc.openmpi"),
            ("libmpich-dev", "mpicc.mpich"),
        )
        if shutil.which(tool(exe)) is None
    ]
    if missing:
        raise UserError(
            f"building the images needs {' '.join(missing)} "
            f"(apt-get install {' '.join(missing)}, or bash setup.sh test)"
        )
    codename = ""
    with open("/etc/os-release") as f:
        for line in f:
            if line.startswith("VERSION_CODENAME="):
                codename = line.split("=", 1)[1].strip().strip('"')
    if codename != SUITE:
        raise UserError(
            f"this host is Debian {codename or '?'}, the images are {SUITE}: the shim "
            "libraries are built here and must match the image's MPI; build on Debian 12 "
            "or with images/Containerfile"
        )


def _prune(parent: Path, prefix: str, keep: Iterable[Path], most: int) -> None:
    """Remove ``prefix*`` directories beyond the ``most`` most recently used, never ``keep``."""
    kept = set(keep)
    others = sorted(
        (p for p in parent.glob(f"{prefix}*") if p.is_dir() and p not in kept),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for stale in others[max(most - len(kept), 0) :]:
        shutil.rmtree(stale, ignore_errors=True)


class _Code:
    """rankpack's code layer, built at most once per call (and per Python of the bases)."""

    def __init__(self, source_root: Path, parent: Path, log: Path) -> None:
        self.source_root, self.parent, self.log = source_root, parent, log
        self.work: Path | None = None
        self.layers: dict[str, tuple[Path, int]] = {}

    def layer(self, python: str) -> tuple[Path, int]:
        if python not in self.layers:
            if self.work is None:
                self.work = Path(tempfile.mkdtemp(prefix=".tmp-code-", dir=self.parent))
            work = self.work / python
            work.mkdir()
            self.layers[python] = build_code(self.source_root, python, work, self.log)
        return self.layers[python]

    def close(self) -> None:
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)


def _ensure_one(
    t: Target, source_root: Path, root: Path, code: _Code, say: Callable[[str], None]
) -> BuiltImage:
    started = time.monotonic()
    bkey, ckey = base_key(source_root, t), code_key(source_root)
    base_dir = root / "base" / f"{t.name}-{bkey[:16]}"
    dev_dir = root / "dev" / f"{t.name}-{bkey[:16]}-{ckey[:16]}"
    base_built = image_built = False
    if not (dev_dir / "image.json").is_file():
        _check_host()
        shutil.rmtree(dev_dir, ignore_errors=True)  # not one of ours: no image.json
        if not (base_dir / "base.json").is_file():
            say(
                f"rankpack: building the {t.name} base image (Debian {SUITE}, "
                f"{' + '.join(t.steps)} packages, venv): minutes, once per package list "
                f"(log: {code.log})"
            )
            build_base(source_root, t, bkey, base_dir, code.log)
            base_built = True
        python = json.loads((base_dir / "base.json").read_text())["python"]
        config = image_config(t, _project_version(source_root), bkey, ckey)
        assemble(t, base_dir, code.layer(python), config, dev_dir, code.log)
        image_built = True
    meta = json.loads((dev_dir / "image.json").read_text())
    base_s = 0.0
    if (base_dir / "base.json").is_file():  # kept for the next code change
        base_s = float(json.loads((base_dir / "base.json").read_text())["seconds"])
        os.utime(base_dir / "base.json")
    _prune(root / "dev", f"{t.name}-", [dev_dir], 1)
    _prune(root / "base", f"{t.name}-", [base_dir], 2)
    return BuiltImage(
        target=t.name,
        ref=t.ref,
        archive=dev_dir / "image.tar",
        archive_bytes=int(meta["archive_bytes"]),
        unpacked_bytes=int(meta["unpacked_bytes"]),
        base_key=bkey,
        code_key=ckey,
        base_built=base_built,
        image_built=image_built,
        base_s=base_s,
        seconds=round(time.monotonic() - started, 2),
    )


def ensure_images(
    source_root: Path,
    cache_root: Path = CACHE_ROOT,
    log: Path | None = None,
    say: Callable[[str], None] = print,
) -> ImageSet:
    """Build or reuse both images from the checkout at ``source_root``: the bases when
    their key is new (minutes), the code layer when the sources changed (seconds)."""
    started = time.monotonic()
    source_root = source_root.resolve()
    root = images_cache(cache_root)
    for t in TARGETS:  # a checkout without images/ is refused before anything is written
        base_key(source_root, t)
    if os.geteuid() != 0 and not os.access(root if root.exists() else cache_root.parent, os.W_OK):
        raise UserError(f"cannot write the image cache {root}: run as root")
    for sub in ("base", "dev"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    code = _Code(source_root, root / "dev", log or root / "build.log")
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for sub in ("base", "dev"):  # what a killed build left (we hold the lock)
            for stale in (root / sub).glob(".tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        try:
            built = tuple(_ensure_one(t, source_root, root, code, say) for t in TARGETS)
        finally:
            code.close()
    return ImageSet(built, time.monotonic() - started)


def _project_version(source_root: Path) -> str:
    with open(source_root / "pyproject.toml", "rb") as f:
        version: str = tomllib.load(f)["project"]["version"]
    return version


def import_images(images: ImageSet, layout: Layout) -> None:
    """Load both images into every node of the dev cluster as their ``:dev`` refs (and into
    a node `start-node` brings back)."""
    for image in images.images:
        add_to_every_node(layout, image.archive, image.ref)


# -- command line --------------------------------------------------------------------------


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def describe(image: BuiltImage) -> str:
    """One line: ref, sizes, and whether it was built or came from the cache."""
    if image.cached:
        how = "cached"
    elif image.base_built:
        how = f"built in {image.seconds:.1f} s (base {image.base_s:.0f} s + code layer)"
    else:
        how = f"code layer rebuilt in {image.seconds:.1f} s (base cached)"
    return (
        f"{image.ref}  {_mb(image.archive_bytes)} archive, {_mb(image.unpacked_bytes)} "
        f"unpacked  {how}  {image.archive}"
    )


def print_result(images: ImageSet, as_json: bool) -> None:
    if as_json:
        json.dump(images.as_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    for image in images.images:
        print(describe(image))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rankpack.devcluster.appimages [--json] [--source DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m rankpack.devcluster.appimages",
        description="Build or reuse rankpack's container images (see the module docstring).",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--source", type=Path, default=None, help="the rankpack checkout")
    args = parser.parse_args(argv)
    try:
        source = find_source_root(args.source)
        result = ensure_images(source, say=(lambda _m: None) if args.json else print)
    except UserError as exc:
        print(f"rankpack: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print_result(result, args.json)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
