"""rankpack's container images, built (or taken from the cache) and run without an engine.

`ensure_images` builds both images from this checkout (`rankpack.devcluster.appimages`:
minutes the first time on a machine, then cached; `setup.sh test` builds them before the
suite). Each image's layers are unpacked as a container runtime would (in order, from its
archive), and its commands run in a chroot with the image config's user, environment and
working directory, in a mount and pid namespace of their own (/proc mounted for them).

Needs root, mmdebstrap and umoci (the build) and unshare/chroot (util-linux, coreutils).
After the build, about 30 s (unpacking some 2 GB) and a bounded time per command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rankpack.devcluster import appimages
from rankpack.devcluster.imagerecipe import RANK_IMAGE, RANKPACK_IMAGE

# Whichever test comes first may build both images: a few minutes cold on 2 cores.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT_S = 120


def _require_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("building and chrooting into the images needs root")
    for exe in ("mmdebstrap", "umoci", "unshare", "chroot"):
        if shutil.which(exe) is None and not Path("/usr/sbin", exe).is_file():
            pytest.skip(f"{exe} is not installed (bash setup.sh test installs it)")


@pytest.fixture(scope="module")
def images() -> appimages.ImageSet:
    _require_tools()
    return appimages.ensure_images(REPO, say=lambda _m: None)


@dataclass(frozen=True)
class Unpacked:
    root: Path
    config: dict[str, object]
    layers: list[list[str]]
    """Each layer's member names, in order."""

    @property
    def env(self) -> list[str]:
        env: list[str] = self.config["Env"]  # type: ignore[assignment]
        return env

    def run(self, script: str) -> subprocess.CompletedProcess[str]:
        """``sh -c script`` in the image, as its user, with its env and working directory."""
        user = str(self.config["User"])
        argv = ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={self.root}/proc"]
        argv += ["chroot", f"--userspec={user}", str(self.root), "env", "-i", *self.env]
        argv += ["sh", "-c", f'cd "{self.config["WorkingDir"]}" && {script}']
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )

    def ok(self, script: str) -> str:
        proc = self.run(script)
        assert proc.returncode == 0, f"{script}: {proc.returncode}\n{proc.stdout}{proc.stderr}"
        return proc.stdout


def _unpack(archive: Path, root: Path) -> Unpacked:
    """Apply the image's layers in order, as containerd would (there are no whiteouts)."""
    with tarfile.open(archive) as outer:

        def blob(digest: str) -> tarfile.ExFileObject:
            f = outer.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert f is not None
            return f

        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]
        (entry,) = index["manifests"]
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == "dev"
        manifest = json.load(blob(entry["digest"]))
        config = json.load(blob(manifest["config"]["digest"]))
        layers = []
        for layer in manifest["layers"]:
            with tempfile.TemporaryFile("w+") as names:
                tar = subprocess.Popen(
                    ["tar", "-xzpv", "--numeric-owner", "-C", str(root)],
                    stdin=subprocess.PIPE,
                    stdout=names,
                )
                assert tar.stdin is not None
                shutil.copyfileobj(blob(layer["digest"]), tar.stdin)
                tar.stdin.close()
                assert tar.wait(timeout=300) == 0
                names.seek(0)
                layers.append(names.read().splitlines())
    return Unpacked(root, config["config"], layers)


def _no_mounts_under(root: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return not any(line.split()[4].startswith(str(root)) for line in f)


@pytest.fixture(scope="module")
def unpacked(images: appimages.ImageSet) -> Iterator[dict[str, Unpacked]]:
    work = Path(tempfile.mkdtemp(prefix="rankpack-images-test-", dir="/var/tmp"))
    try:
        result = {}
        for image in images.images:
            root = work / image.target
            root.mkdir()
            result[image.target] = _unpack(image.archive, root)
        yield result
    finally:
        # The commands' /proc was mounted in their own mount namespace, gone with them.
        assert _no_mounts_under(work)
        shutil.rmtree(work)


def test_a_second_call_takes_both_images_from_the_cache(images: appimages.ImageSet) -> None:
    assert [i.ref for i in images.images] == [RANKPACK_IMAGE, RANK_IMAGE]
    again = appimages.ensure_images(REPO, say=lambda _m: None)
    assert all(i.cached for i in again.images)
    assert [i.archive for i in again.images] == [i.archive for i in images.images]
    assert again.seconds < 10
    for image in again.images:
        assert image.archive.stat().st_size == image.archive_bytes
        assert image.unpacked_bytes > image.archive_bytes


def test_the_rank_image_runs_openfoam_both_mpis_and_rankpack_as_1000(
    unpacked: dict[str, Unpacked],
) -> None:
    rank = unpacked["rank"]
    assert rank.config["User"] == "1000:1000"
    assert rank.env[0].startswith("PATH=/opt/rankpack/bin:")
    assert rank.ok("id -u; id -g; id -un").split() == ["1000", "1000", "rankpack"]
    assert "Usage: simpleFoam" in rank.ok("simpleFoam -help")
    assert "Open MPI" in rank.ok("mpirun --version")
    assert "MPICH Version" in rank.ok("mpichversion")
    assert "usage: rankpack" in rank.ok("rankpack --help")
    assert rank.ok("command -v rankpack; command -v rankpack-exec").split() == [
        "/opt/rankpack/bin/rankpack",
        "/opt/rankpack/bin/rankpack-exec",
    ]
    # rankpack finds the tutorials it stages by name.
    found = rank.ok(
        "python -c 'from rankpack.case.openfoam import resolve_case as r; "
        'print(r("pitzDaily").path)\''
    )
    assert found.strip().endswith("incompressible/simpleFoam/pitzDaily")
    # The shim libraries are in the package and load against the image's MPIs.
    libs = rank.ok(
        "python -c 'from rankpack.profile.shim import shim_library as s; "
        'print(s("openmpi")); print(s("mpich"))\''
    ).split()
    assert [Path(p).name for p in libs] == [
        "librankpack_pmpi.openmpi.so",
        "librankpack_pmpi.mpich.so",
    ]
    for lib in libs:
        assert lib.startswith("/opt/rankpack/lib/python3.11/site-packages/rankpack/_lib/")
        assert "not found" not in rank.ok(f"ldd {lib}")
    # The venv is root's: the rankpack user cannot change the code it runs; HOME is its own.
    assert rank.run("test -w /opt/rankpack/bin || test -w /opt/rankpack/lib").returncode != 0
    rank.ok('touch "$HOME/written"')


def test_the_rankpack_image_has_rankpack_and_no_openfoam_or_mpi(
    unpacked: dict[str, Unpacked],
) -> None:
    image = unpacked["rankpack"]
    assert image.config["User"] == "1000:1000"
    assert not any(e.startswith(("WM_PROJECT_DIR=", "LD_LIBRARY_PATH=")) for e in image.env)
    assert "usage: rankpack" in image.ok("rankpack --help")
    image.ok("python -c 'import kubernetes, prometheus_client, rankpack.operator'")
    for exe in ("simpleFoam", "mpirun", "mpichversion"):
        assert image.run(f"command -v {exe}").returncode != 0, exe
    names = {n.removeprefix("./") for layer in image.layers for n in layer}
    assert "opt/rankpack/bin/rankpack" in names
    assert not any(n.startswith(("usr/share/openfoam", "usr/lib/openfoam")) for n in names)


@pytest.mark.parametrize("name", ["rankpack", "rank"])
def test_nothing_of_the_build_host_stays(unpacked: dict[str, Unpacked], name: str) -> None:
    image = unpacked[name]
    names = {n.removeprefix("./").rstrip("/") for layer in image.layers for n in layer}
    for absent in ("etc/resolv.conf", "etc/hostname", "tmp/rankpack-images"):
        assert absent not in names
    assert not any(n.startswith("dev/") for n in names)  # no device nodes in a layer
    assert not any(n.startswith("tmp/") for n in names)
    assert "etc/dpkg/dpkg.cfg.d/rankpack" in names
    assert "etc/dpkg/dpkg.cfg.d/99mmdebstrap" not in names
    # Two layers: the base, then rankpack's code (nothing but /opt/rankpack).
    assert len(image.layers) == 2
    assert all(n.startswith("opt") for n in image.layers[1])


def test_the_cli_reports_both_images(images: appimages.ImageSet) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rankpack", "dev-cluster", "images", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [(i["ref"], i["cached"]) for i in data["images"]] == [
        (RANKPACK_IMAGE, True),
        (RANK_IMAGE, True),
    ]
    bad = subprocess.run(
        [sys.executable, "-m", "rankpack", "dev-cluster", "images", "--source", "/nonexistent"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "not a rankpack checkout" in bad.stderr
