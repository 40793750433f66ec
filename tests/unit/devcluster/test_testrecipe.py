"""The test images' recipe, pure parts: keys, references, apt sources for another suite, the
mmdebstrap command; and the builder's parts that start nothing (an interrupted build, the
rankpack check, the command line's refusal). Nothing is built here
(tests/integration/test_test_images.py builds, lists and runs them)."""

from __future__ import annotations

import re
import shutil
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from rankpack.devcluster import testimages, testrecipe
from rankpack.devcluster.testrecipe import RECIPES, recipe, recipe_key, recipe_ref
from rankpack.errors import UserError
from rankpack.plan.submission import IMAGE_PATTERN

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "images", root / "images")
    return root


def test_three_images_of_the_issue() -> None:
    assert [(r.name, r.suite, r.solver, r.mpi) for r in RECIPES] == [
        ("openfoam-trixie", "trixie", "simpleFoam", "openmpi"),
        ("mpich-rankloop", "trixie", "rankloop", "mpich"),
        ("serial-rankloop", "bookworm", "rankloop-serial", None),
    ]
    # Nothing of rankpack is asked for, and what is compiled is purged with its compiler.
    for r in RECIPES:
        assert not any("rankpack" in p for p in (*r.packages, *r.build_packages))
        assert bool(r.builds) == bool(r.build_packages)
    with pytest.raises(UserError, match="no test image 'nope': the test images are"):
        recipe("nope")


def test_keys_are_stable_differ_per_image_and_follow_the_sources(checkout: Path) -> None:
    keys = [recipe_key(checkout, r) for r in RECIPES]
    assert len(set(keys)) == 3
    assert keys == [recipe_key(checkout, r) for r in RECIPES]
    src = checkout / testrecipe.SOURCES / "rankloop.c"
    src.write_text(src.read_text() + "/* changed */\n")
    assert all(recipe_key(checkout, r) != k for r, k in zip(RECIPES, keys, strict=True))
    before = recipe_key(checkout, RECIPES[0])
    (checkout / "images" / "dpkg.cfg").write_text("path-exclude=/usr/share/man/*\n")
    assert recipe_key(checkout, RECIPES[0]) != before


def test_a_checkout_without_the_sources_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a rankpack checkout with images/testimages/"):
        recipe_key(tmp_path, RECIPES[0])


def test_refs_are_image_references_load_image_reads() -> None:
    ref = recipe_ref(RECIPES[0], "0123456789abcdef" * 4)
    assert ref == "rankpack.test/openfoam-trixie:0123456789ab"
    assert re.fullmatch(IMAGE_PATTERN, ref)


HOST = {
    "debian.sources": (
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n"
    ),
    "other.list": "deb https://vendor.example/apt stable main\n",
}


def test_suite_sources_rename_the_hosts_entries() -> None:
    text = testrecipe.suite_sources(HOST, "bookworm", "trixie")
    assert "Suites: trixie trixie-updates\n" in text
    assert "Suites: trixie-security\n" in text
    assert "bookworm" not in text and "vendor.example" not in text
    assert text.count("URIs: http://mirror.example/") == 2
    same = testrecipe.suite_sources(HOST, "bookworm", "bookworm")
    assert "Suites: bookworm bookworm-updates\n" in same
    assert testrecipe.suite_sources({}, "bookworm", "trixie") == ""


def test_mmdebstrap_builds_then_purges_then_cleans() -> None:
    image = recipe("mpich-rankloop")
    argv = testrecipe.mmdebstrap_argv(image, Path("/w/in"), Path("/w/src"), Path("/w/dpkg.cfg"))
    assert argv[:6] == [
        "mmdebstrap", "--mode=root", "--variant=minbase", "--format=tar",
        "--aptopt=APT::Install-Recommends false", "--dpkgopt=/w/dpkg.cfg",
    ]  # fmt: skip
    assert argv[6] == "--include=mpich,libmpich-dev,gcc,libc6-dev"
    assert argv[-3:] == ["trixie", "-", "/w/src"]
    hooks = [a.removeprefix("--customize-hook=") for a in argv if a.startswith("--customize")]
    copy, build, purge, clean = hooks
    assert copy.endswith('cp -a /w/in/. "$1"/tmp/rankpack-test-images/')
    assert "mpicc.mpich" in build and "-o /usr/local/bin/rankloop rankloop.c" in build
    assert purge.endswith("apt-get purge -y -qq --autoremove libmpich-dev gcc libc6-dev")
    for gone in ("/tmp/rankpack-test-images", "/etc/resolv.conf", "/etc/hostname"):
        assert f'"$1"{gone}' in clean
    # An image of packages alone has no build or purge step.
    plain = testrecipe.mmdebstrap_argv(recipe("openfoam-trixie"), Path("/i"), Path("/s"),
                                       Path("/d"))  # fmt: skip
    assert "--include=openfoam,openfoam-examples,openmpi-bin" in plain
    assert sum(a.startswith("--customize-hook=") for a in plain) == 2
    assert plain[-3] == "trixie"


def test_the_images_run_as_a_numeric_user_with_a_path() -> None:
    assert re.fullmatch(r"[1-9][0-9]*:[0-9]+", testrecipe.USER)
    assert testrecipe.config_env(RECIPES[0])[0] == ("PATH", testrecipe.PATH)
    assert "openfoam-trixie  Debian 13" in testrecipe.describe(RECIPES)


# -- the builder's parts that start nothing ----------------------------------------------------


def test_an_interrupted_build_leaves_nothing(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(testimages, "pipeline", interrupted)
    monkeypatch.setattr(testimages, "host_apt_source_files",
                        lambda: {"debian.sources": HOST["debian.sources"]})  # fmt: skip
    parent = tmp_path / "cache" / "test"
    parent.mkdir(parents=True)
    with pytest.raises(KeyboardInterrupt):
        testimages.build_test_image(checkout, RECIPES[1], "0123", parent / "x-0123", tmp_path / "l")
    assert list(parent.iterdir()) == []


def test_a_root_filesystem_naming_rankpack_is_found(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        for name in ("./usr/bin/sh", "./opt/RankPack/bin/x", "./usr/lib/librankpack_pmpi.so"):
            tar.addfile(tarfile.TarInfo(name))
    assert testimages.rankpack_paths(rootfs) == ["./opt/RankPack/bin/x",
                                                 "./usr/lib/librankpack_pmpi.so"]  # fmt: skip


def test_an_unknown_image_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert testimages.main(["nope", "--source", str(REPO)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no test image 'nope'" in err


def test_describe_says_built_or_cached() -> None:
    image = testimages.BuiltTestImage(
        name="mpich-rankloop", ref="rankpack.test/mpich-rankloop:0123456789ab",
        archive=Path("/c/image.tar"), archive_bytes=62_000_000, unpacked_bytes=177_000_000,
        key="0" * 64, solver="rankloop", mpi="mpich", built=False, build_s=97.0, seconds=0.01,
    )  # fmt: skip
    assert testimages.describe(image) == (
        "rankpack.test/mpich-rankloop:0123456789ab  62 MB archive, 177 MB unpacked  "
        "cached (built in 97 s)  /c/image.tar"
    )
    assert testimages.describe(replace(image, built=True, seconds=96.6)).endswith(
        "unpacked  built in 97 s  /c/image.tar"
    )
    assert image.as_json()["archive"] == "/c/image.tar"
