"""The test images: Simulation images as a team would bring them, with nothing of rankpack.

``python -m rankpack.devcluster.testimages [--json] [--source DIR] [NAME ...]`` builds (or
takes from the cache) the images `rankpack.devcluster.testrecipe` describes and prints each
one's OCI archive, which ``rankpack dev-cluster load-image ARCHIVE`` puts on every node
under the name it carries (``rankpack.test/NAME:KEY12``). `ensure_test_images` is the same
for tests.

Each image is one layer: ``mmdebstrap`` (minbase, no Recommends, the dpkg path filters of
``images/dpkg.cfg``: no manuals, no docs but OpenFOAM's tutorials) makes the root filesystem
in a chroot, programs of ``images/testimages/`` are compiled in it and their compilers purged,
``umoci`` makes the layer and the config (user 1000:1000, with no entry in /etc/passwd).
A build refuses a root filesystem with any path naming rankpack.

Cache (``$RANKPACK_CACHE/images``, beside `rankpack.devcluster.appimages`' images, under
the same lock)::

    test/<name>-<key16>/{image.tar, image.json}

Built in a ``.tmp-*`` sibling and renamed into place; an image's older keys are pruned.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rankpack.devcluster.appimages import find_source_root, images_cache
from rankpack.devcluster.applayers import pipeline, tar_file_bytes
from rankpack.devcluster.binaries import CACHE_ROOT
from rankpack.devcluster.imagerecipe import SUITE, host_apt_source_files
from rankpack.devcluster.images import run_step
from rankpack.devcluster.packages import tool
from rankpack.devcluster.testrecipe import (
    RECIPES,
    SOURCES,
    USER,
    Recipe,
    config_env,
    mmdebstrap_argv,
    recipe,
    recipe_key,
    recipe_ref,
    source_files,
    suite_sources,
)
from rankpack.errors import UserError

BUILD_TIMEOUT_S = 1800.0
NAME_KEY = "io.containerd.image.name"
"""The index annotation ``ctr images import`` (and so ``load-image``) names an image by."""
FORBIDDEN = "rankpack"
"""No path of a test image's root filesystem may contain this."""


@dataclass(frozen=True)
class BuiltTestImage:
    """One test image's archive, and how this call got it."""

    name: str
    ref: str
    archive: Path
    archive_bytes: int
    unpacked_bytes: int
    key: str
    solver: str
    mpi: str | None
    built: bool
    """This call built it; False: it came from the cache."""
    build_s: float
    """Seconds its build took (now, or when it was built)."""
    seconds: float
    """Seconds this call spent on it."""

    def as_json(self) -> dict[str, object]:
        data = asdict(self)
        data["archive"] = str(self.archive)
        return data


def _check_host() -> None:
    if os.geteuid() != 0:
        raise UserError("building the test images needs root (mmdebstrap, chroot): run as root")
    missing = [exe for exe in ("mmdebstrap", "umoci") if shutil.which(tool(exe)) is None]
    if missing:
        raise UserError(f"building the test images needs {' '.join(missing)} "
                        f"(apt-get install {' '.join(missing)})")  # fmt: skip


def rankpack_paths(rootfs_tar: Path) -> list[str]:
    """The paths of a layer or root filesystem tar that name rankpack (none, for a test
    image)."""
    with tarfile.open(rootfs_tar) as tar:
        return [m.name for m in tar if FORBIDDEN in m.name.lower()]


def _oci_archive(
    image: Recipe, ref: str, key: str, rootfs_tar: Path, work: Path, log: Path
) -> Path:
    """The OCI layout of one layer and the image config, as a tar named ``ref``."""
    umoci = tool("umoci")
    layout = work / "oci"
    tag = ref.rpartition(":")[2]
    image_arg = f"{layout}:{tag}"
    run_step([umoci, "init", "--layout", str(layout)], log)
    run_step([umoci, "new", "--image", image_arg], log)
    created_by = f"mmdebstrap {image.suite} minbase: {' '.join(image.packages) or '(none)'}"
    run_step([umoci, "raw", "add-layer", "--image", image_arg, "--history.created_by",
              created_by, str(rootfs_tar)], log, timeout_s=900)  # fmt: skip
    config = [umoci, "config", "--image", image_arg, "--config.user", USER]
    for name, value in config_env(image):
        config += ["--config.env", f"{name}={value}"]
    config += ["--config.cmd", "/bin/sh"]
    config += ["--config.label", f"org.opencontainers.image.title=rankpack-test/{image.name}"]
    config += ["--config.label", f"dev.rankpack.test-key={key[:16]}"]
    run_step(config, log)
    run_step([umoci, "gc", "--layout", str(layout)], log)
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text())
    for entry in index["manifests"]:
        entry.setdefault("annotations", {})[NAME_KEY] = ref
    index_path.write_text(json.dumps(index))
    archive = work / "image.tar"
    with tarfile.open(archive, "w") as tar:
        for entry in sorted(layout.iterdir()):
            tar.add(entry, arcname=entry.name)
    shutil.rmtree(layout)
    return archive


def build_test_image(source_root: Path, image: Recipe, key: str, dest: Path, log: Path) -> None:
    """Build ``image`` into ``dest`` (image.tar, image.json); ``dest`` must not exist, and
    appears whole or not at all."""
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{image.name}-", dir=dest.parent))
    try:
        inputs = work / "inputs"
        inputs.mkdir()
        for path in source_files(source_root):
            target = inputs / path.relative_to(source_root / SOURCES)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        dpkg_cfg = work / "dpkg.cfg"
        shutil.copyfile(source_root / "images" / "dpkg.cfg", dpkg_cfg)
        sources = work / "debian.sources"
        sources.write_text(suite_sources(host_apt_source_files(), SUITE, image.suite))
        if not sources.read_text().strip():
            raise UserError(f"this host's apt sources (/etc/apt) have no entry for {SUITE}")
        rootfs_tar = work / "rootfs.tar"
        argv = mmdebstrap_argv(image, inputs, sources, dpkg_cfg)
        argv[0] = tool("mmdebstrap")
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LC_ALL": "C.UTF-8"}  # fmt: skip
        filter_ = [tool("mmtarfilter"), "--path-exclude=/dev/*"]
        pipeline(argv, filter_, rootfs_tar, log, BUILD_TIMEOUT_S, env)
        named = rankpack_paths(rootfs_tar)
        if named:
            raise UserError(f"the test image {image.name} holds {named[0]!r}: it must hold "
                            "nothing of rankpack")  # fmt: skip
        unpacked = tar_file_bytes(rootfs_tar)
        ref = recipe_ref(image, key)
        archive = _oci_archive(image, ref, key, rootfs_tar, work, log)
        for leftover in (rootfs_tar, sources, dpkg_cfg):
            leftover.unlink()
        shutil.rmtree(inputs)
        meta = {
            "name": image.name,
            "ref": ref,
            "key": key,
            "suite": image.suite,
            "packages": list(image.packages),
            "archive_bytes": archive.stat().st_size,
            "unpacked_bytes": unpacked,
            "seconds": round(time.monotonic() - started, 1),
        }
        (work / "image.json").write_text(json.dumps(meta, indent=2) + "\n")
        work.chmod(0o755)
        os.rename(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _ensure_one(
    source_root: Path, image: Recipe, root: Path, log: Path, say: Callable[[str], None]
) -> BuiltTestImage:
    started = time.monotonic()
    key = recipe_key(source_root, image)
    dest = root / f"{image.name}-{key[:16]}"
    built = False
    if not (dest / "image.json").is_file():
        _check_host()
        shutil.rmtree(dest, ignore_errors=True)  # not one of ours: no image.json
        say(f"rankpack: building the test image {image.name} (Debian {image.suite}): "
            f"minutes, once per recipe (log: {log})")  # fmt: skip
        build_test_image(source_root, image, key, dest, log)
        built = True
    meta = json.loads((dest / "image.json").read_text())
    os.utime(dest / "image.json")
    for stale in root.glob(f"{image.name}-*"):
        if stale != dest and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    return BuiltTestImage(
        name=image.name,
        ref=str(meta["ref"]),
        archive=dest / "image.tar",
        archive_bytes=int(meta["archive_bytes"]),
        unpacked_bytes=int(meta["unpacked_bytes"]),
        key=key,
        solver=image.solver,
        mpi=image.mpi,
        built=built,
        build_s=float(meta["seconds"]),
        seconds=round(time.monotonic() - started, 2),
    )


def ensure_test_images(
    source_root: Path,
    names: Sequence[str] = (),
    cache_root: Path = CACHE_ROOT,
    log: Path | None = None,
    say: Callable[[str], None] = print,
) -> list[BuiltTestImage]:
    """Build or reuse the test images named (all of them if none), in `RECIPES`' order."""
    wanted = [recipe(n) for n in names] if names else list(RECIPES)
    source_root = source_root.resolve()
    for image in wanted:  # a checkout without the sources is refused before anything is written
        recipe_key(source_root, image)
    cache = images_cache(cache_root)
    root = cache / "test"
    if os.geteuid() != 0 and not os.access(cache if cache.exists() else cache_root, os.W_OK):
        raise UserError(f"cannot write the image cache {cache}: run as root")
    root.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (appimages' lock: one build at a time)
        for stale in root.glob(".tmp-*"):  # what a killed build left (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        return [
            _ensure_one(source_root, image, root, log or root / "build.log", say)
            for image in wanted
        ]


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def describe(image: BuiltTestImage) -> str:
    how = (
        f"built in {image.seconds:.0f} s"
        if image.built
        else f"cached (built in {image.build_s:.0f} s)"
    )
    return (f"{image.ref}  {_mb(image.archive_bytes)} archive, {_mb(image.unpacked_bytes)} "
            f"unpacked  {how}  {image.archive}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rankpack.devcluster.testimages [--json] [--source DIR] [NAME ...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m rankpack.devcluster.testimages",
        description="Build or reuse the test images (Simulation images without rankpack) and "
        "print their archives, for `rankpack dev-cluster load-image ARCHIVE`.",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"an image ({', '.join(i.name for i in RECIPES)}; default: all)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--source", type=Path, default=None, help="the rankpack checkout")
    args = parser.parse_args(argv)  # fmt: skip
    try:
        source = find_source_root(args.source)
        say = (lambda _m: None) if args.json else print
        built = ensure_test_images(source, args.names, say=say)
    except UserError as exc:
        print(f"rankpack: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if args.json:
        json.dump([b.as_json() for b in built], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for image in built:
            print(describe(image))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
