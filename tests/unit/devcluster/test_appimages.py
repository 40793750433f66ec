"""The container images' recipe, pure parts: cache keys, image config, argv lists, apt
sources, the build environment, and that images/Containerfile says what the builder does;
the build steps (`applayers`) leave no half cache. Nothing is built here
(tests/integration/test_app_images.py builds and runs them)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import tarfile
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from rankpack.case import openfoam
from rankpack.devcluster import appimages, applayers, imagerecipe
from rankpack.devcluster.imagerecipe import TARGETS, target
from rankpack.errors import UserError

REPO = Path(__file__).resolve().parents[3]
RANKPACK = target("rankpack")
RANK = target("rank")


def _load_install_code() -> ModuleType:
    spec = importlib.util.spec_from_file_location("install_code", REPO / "images/install-code.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


install_code = _load_install_code()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of what the keys read: images/, pyproject.toml, a small src/ and shim/."""
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "images", root / "images")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    pkg = root / "src" / "rankpack"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "__init__.py").write_text("def entry() -> int:\n    return 0\n")
    (pkg / "py.typed").write_text("")
    (root / "shim").mkdir()
    (root / "shim" / "rankpack_pmpi.c").write_text("int x;\n")
    return root


def _keys(root: Path) -> tuple[str, str, str]:
    return (
        imagerecipe.base_key(root, RANKPACK),
        imagerecipe.base_key(root, RANK),
        imagerecipe.code_key(root),
    )


# -- cache keys ------------------------------------------------------------------------------


def test_keys_are_stable_and_differ_per_target(checkout: Path) -> None:
    first = _keys(checkout)
    assert first == _keys(checkout)
    assert len(set(first)) == 3


def test_a_rankpack_package_rebuilds_both_bases_not_the_code(checkout: Path) -> None:
    before = _keys(checkout)
    with open(checkout / "images/packages/rankpack.txt", "a") as f:
        f.write("procps\n")
    after = _keys(checkout)
    assert after[0] != before[0] and after[1] != before[1] and after[2] == before[2]


def test_a_rank_package_rebuilds_only_the_rank_base(checkout: Path) -> None:
    before = _keys(checkout)
    with open(checkout / "images/packages/rank.txt", "a") as f:
        f.write("gnuplot-nox\n")
    after = _keys(checkout)
    assert (after[0], after[2]) == (before[0], before[2]) and after[1] != before[1]


def test_comments_in_a_package_list_do_not_count(checkout: Path) -> None:
    before = _keys(checkout)
    lists = checkout / "images/packages/rank.txt"
    lists.write_text("# reworded\n\n" + lists.read_text().replace("mpich", "mpich  # MPICH"))
    assert _keys(checkout) == before


@pytest.mark.parametrize("name", ["install-rootfs.sh", "dpkg.cfg"])
def test_the_install_script_and_dpkg_filters_rebuild_both_bases(checkout: Path, name: str) -> None:
    before = _keys(checkout)
    with open(checkout / "images" / name, "a") as f:
        f.write("# changed\n")
    after = _keys(checkout)
    assert after[0] != before[0] and after[1] != before[1] and after[2] == before[2]


def test_dependencies_rebuild_the_bases_other_pyproject_changes_only_the_code(
    checkout: Path,
) -> None:
    pyproject = checkout / "pyproject.toml"
    text = pyproject.read_text()
    before = _keys(checkout)
    pyproject.write_text(text.replace('version = "0.1.0"', 'version = "0.1.1"'))
    bumped = _keys(checkout)
    assert bumped[:2] == before[:2] and bumped[2] != before[2]
    pyproject.write_text(text.replace('"rich>=13",', '"rich>=14",'))
    assert _keys(checkout)[0] != before[0] and _keys(checkout)[1] != before[1]


def test_the_suite_is_part_of_the_base_key(checkout: Path) -> None:
    assert imagerecipe.base_key(checkout, RANK, "trixie") != imagerecipe.base_key(checkout, RANK)


@pytest.mark.parametrize(
    "rel",
    ["src/rankpack/cli/__init__.py", "shim/rankpack_pmpi.c", "images/install-code.py"],
)
def test_a_source_change_rebuilds_only_the_code(checkout: Path, rel: str) -> None:
    before = _keys(checkout)
    with open(checkout / rel, "a") as f:
        f.write("\n")
    after = _keys(checkout)
    assert after[:2] == before[:2] and after[2] != before[2]


def test_a_new_source_file_rebuilds_the_code(checkout: Path) -> None:
    before = imagerecipe.code_key(checkout)
    (checkout / "src/rankpack/new.py").write_text("")
    assert imagerecipe.code_key(checkout) != before


@pytest.mark.parametrize(
    "rel",
    [
        "src/rankpack/__pycache__/cli.cpython-311.pyc",
        "src/rankpack/_lib/librankpack_pmpi.openmpi.so",
        "src/rankpack.egg-info/PKG-INFO",
        "shim/build/librankpack_pmpi.mpich.so",
        "images/Containerfile.local",
    ],
)
def test_build_outputs_and_caches_do_not_count(checkout: Path, rel: str) -> None:
    before = _keys(checkout)
    (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
    (checkout / rel).write_bytes(b"\x7fELF")
    assert _keys(checkout) == before


def test_a_checkout_without_images_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a rankpack checkout"):
        imagerecipe.base_key(tmp_path, RANK)


# -- the repository's own recipe -------------------------------------------------------------


def test_package_lists() -> None:
    rankpack = imagerecipe.package_names((REPO / "images/packages/rankpack.txt").read_text())
    rank = imagerecipe.package_names((REPO / "images/packages/rank.txt").read_text())
    assert {"python3", "python3-venv", "ca-certificates", "passwd"} <= set(rankpack)
    assert {"openfoam", "openfoam-examples", "openmpi-bin", "mpich"} <= set(rank)
    assert not set(rankpack) & {"openfoam", "openmpi-bin", "mpich"}
    assert imagerecipe.package_names("a b # c d\n# e\n\n  f\n") == ["a", "b", "f"]


def test_no_mirror_or_index_address_is_written_in_the_recipe() -> None:
    for path in [*(REPO / "images").rglob("*"), REPO / "src/rankpack/devcluster/imagerecipe.py"]:
        if path.is_file():
            assert "://" not in path.read_text(), path


def test_unknown_target() -> None:
    with pytest.raises(UserError, match="no image 'operator'"):
        target("operator")


# -- image config ----------------------------------------------------------------------------


def test_image_config() -> None:
    config = imagerecipe.image_config(RANK, "0.1.0", "b" * 64, "c" * 64)
    env = dict(config.env)
    assert config.user == "1000:1000"
    assert env["PATH"].split(":")[0] == "/opt/rankpack/bin"
    assert env["HOME"] == config.workdir == "/home/rankpack"
    assert env["WM_PROJECT_DIR"] == "/usr/share/openfoam"
    assert config.cmd == ("rankpack", "--help")
    labels = dict(config.labels)
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["dev.rankpack.code-key"] == "c" * 16
    plain = dict(imagerecipe.image_config(RANKPACK, "0.1.0", "b" * 64, "c" * 64).env)
    assert "WM_PROJECT_DIR" not in plain and "LD_LIBRARY_PATH" not in plain


def test_the_rank_image_sets_what_foam_env_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rank image's OpenFOAM variables are those rankpack sets on a Debian host."""
    monkeypatch.setattr(Path, "is_dir", lambda self: True)
    host = openfoam.foam_env({})
    assert dict(RANK.env) == {k: host[k] for k in ("WM_PROJECT_DIR", "LD_LIBRARY_PATH")}


def test_umoci_config_argv() -> None:
    config = imagerecipe.ImageConfig(
        "1000:1000", (("A", "1"), ("B", "x=y")), "/home/r", ("rankpack", "--help"), (("l", "v"),)
    )
    assert imagerecipe.umoci_config_argv("umoci", "/c/oci:dev", config) == [
        "umoci", "config", "--image", "/c/oci:dev", "--config.user", "1000:1000",
        "--config.env", "A=1", "--config.env", "B=x=y", "--config.workingdir", "/home/r",
        "--config.cmd", "rankpack", "--config.cmd", "--help", "--config.label", "l=v",
    ]  # fmt: skip


def _containerfile_stages() -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in (REPO / "images/Containerfile").read_text().splitlines():
        m = re.match(r"FROM (\S+) AS (\S+)", line)
        if m:
            current = stages.setdefault(m.group(2), [f"FROM {m.group(1)}"])
        elif line and not line.startswith("#"):
            current.append(line)
    return stages


@pytest.mark.parametrize("t", TARGETS, ids=lambda t: t.name)
def test_the_containerfile_sets_the_builders_config(t: imagerecipe.Target) -> None:
    stage = _containerfile_stages()[t.name]
    config = imagerecipe.image_config(t, "0.1.0", "b" * 64, "c" * 64)
    env = [
        tuple(line.removeprefix("ENV ").split("=", 1)) for line in stage if line.startswith("ENV ")
    ]
    assert env == list(config.env)
    assert f"USER {config.user}" in stage
    assert f"WORKDIR {config.workdir}" in stage
    assert f"CMD {list(config.cmd)!r}".replace("'", '"') in stage
    assert f"LABEL org.opencontainers.image.title=rankpack/{t.name}" in stage


def test_the_containerfile_runs_the_builders_install_steps() -> None:
    stages = _containerfile_stages()
    runs: dict[str, list[str]] = {}
    for name, lines in stages.items():
        runs[name] = re.findall(r"RUN sh \S*/install-rootfs\.sh (\w+)", "\n".join(lines))
    assert stages["rankpack-base"][0] == "FROM debian:bookworm-slim"
    assert stages["rank-base"][0] == "FROM rankpack-base"
    assert stages["rankpack"][0] == "FROM rankpack-base"
    assert stages["rank"][0] == "FROM rank-base"
    assert tuple(runs["rankpack-base"]) == RANKPACK.steps
    assert tuple(runs["rankpack-base"] + runs["rank-base"]) == RANK.steps
    assert f"debian:{imagerecipe.SUITE}-slim" in stages["code"][0]


# -- how the base is bootstrapped ------------------------------------------------------------


def test_mmdebstrap_argv() -> None:
    argv = imagerecipe.mmdebstrap_argv(
        RANK, ["python3", "openfoam"], Path("/w/in puts"), Path("/w/debian.sources"), Path("/w/py")
    )
    assert argv[:4] == ["mmdebstrap", "--mode=root", "--variant=minbase", "--format=tar"]
    assert "--include=python3,openfoam" in argv
    assert "--dpkgopt=/w/in puts/dpkg.cfg" in argv
    assert argv[-3:] == ["bookworm", "-", "/w/debian.sources"]
    hooks = [a.removeprefix("--customize-hook=") for a in argv if a.startswith("--customize")]
    assert "'/w/in puts'/." in hooks[0]
    assert hooks[1:3] == [
        'chroot "$1" sh /tmp/rankpack-images/install-rootfs.sh rankpack',
        'chroot "$1" sh /tmp/rankpack-images/install-rootfs.sh rank',
    ]
    assert hooks[3].endswith("> /w/py")
    assert "/etc/resolv.conf" in hooks[-1] and "/tmp/rankpack-images" in hooks[-1]


def test_build_env_passes_the_index_and_proxies_only() -> None:
    env = imagerecipe.build_env(
        {
            "PIP_INDEX_URL": "INDEX",
            "https_proxy": "PROXY",
            "PIP_FIND_LINKS": "/opt/wheels",
            "PIP_CERT": "/etc/ssl/certs/x.crt",
            "PYTHONPATH": "/work/src",
            "PATH": "/host/bin",
        },
        with_ca=True,
    )
    assert env["PIP_INDEX_URL"] == "INDEX" and env["https_proxy"] == "PROXY"
    assert env["PIP_CERT"] == "/tmp/rankpack-images/host-ca.crt"
    assert "PIP_FIND_LINKS" not in env and "PYTHONPATH" not in env
    assert env["PATH"].startswith("/usr/local/sbin:")
    assert "PIP_CERT" not in imagerecipe.build_env({}, with_ca=False)


def test_host_ca_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.crt"
    bundle.write_text("x")
    assert imagerecipe.host_ca_bundle({"PIP_CERT": str(bundle)}) == bundle
    assert (
        imagerecipe.host_ca_bundle(
            {"PIP_CERT": str(tmp_path / "none"), "SSL_CERT_FILE": str(bundle)}
        )
        == bundle
    )


HOST_DEB822 = """\
Types: deb deb-src
# a snapshot comment
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates trixie
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm-security
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 abc
 -----END PGP PUBLIC KEY BLOCK-----

Types: deb
Enabled: no
URIs: http://old.invalid/debian
Suites: bookworm
Components: main
"""


def test_apt_sources_keeps_the_hosts_entries_for_the_suite() -> None:
    text = imagerecipe.apt_sources(
        {
            "debian.sources": HOST_DEB822,
            "vendor.sources": "Types: deb\nURIs: https://vendor.invalid/apt\n"
            "Suites: nodistro\nComponents: main\n",
            "cloud.list": "deb https://cloud.invalid/apt cloud-sdk-bookworm main\n",
            "sources.list": "# deb http://x.invalid/debian bookworm main\n"
            "deb [arch=amd64 signed-by=/k.gpg] http://one.invalid/debian bookworm-backports main\n"
            "deb-src http://one.invalid/debian bookworm main\n",
        }
    )
    stanzas = text.strip().split("\n\n")
    assert len(stanzas) == 3
    assert (
        "Types: deb\nURIs: http://mirror.invalid/debian\nSuites: bookworm bookworm-updates\n"
        in text
    )
    assert " -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n" in text
    assert "Suites: bookworm-security" in text
    assert "Architectures: amd64" in text and "signed-by: /k.gpg" in text
    for absent in ("trixie", "old.invalid", "vendor", "cloud", "deb-src", "x.invalid", "#"):
        assert absent not in text
    assert imagerecipe.apt_sources({"a.sources": HOST_DEB822}, "sid") == ""


# -- results and the command line ------------------------------------------------------------


def _image(**changes: object) -> appimages.BuiltImage:
    values: dict[str, object] = {
        "target": "rank",
        "ref": "rankpack.local/rank:dev",
        "archive": Path("/c/images/dev/rank-x-y/image.tar"),
        "archive_bytes": 429_000_000,
        "unpacked_bytes": 1_299_000_000,
        "base_key": "b" * 64,
        "code_key": "c" * 64,
        "base_built": False,
        "image_built": False,
        "base_s": 113.0,
        "seconds": 0.01,
    }
    values.update(changes)
    return appimages.BuiltImage(**values)  # type: ignore[arg-type]


def test_describe_says_what_was_built() -> None:
    assert "  cached  " in appimages.describe(_image())
    assert "code layer rebuilt in 3.0 s" in appimages.describe(_image(image_built=True, seconds=3))
    line = appimages.describe(_image(base_built=True, image_built=True, seconds=120))
    assert line.startswith("rankpack.local/rank:dev  429 MB archive, 1299 MB unpacked  built in")
    assert "\n" not in line


def test_image_set_json() -> None:
    images = appimages.ImageSet((_image(target="rankpack"), _image()), 0.5)
    assert images.rank.target == "rank" and images.rankpack.target == "rankpack"
    data = images.as_json()
    assert data["seconds"] == 0.5
    first = data["images"][0]  # type: ignore[index]
    assert first["archive"] == "/c/images/dev/rank-x-y/image.tar" and first["cached"] is True


def test_find_source_root(tmp_path: Path, checkout: Path) -> None:
    assert appimages.find_source_root() == REPO
    assert appimages.find_source_root(checkout) == checkout.resolve()
    with pytest.raises(UserError, match="not a rankpack checkout"):
        appimages.find_source_root(tmp_path)
    with pytest.raises(UserError, match="give the checkout with --source"):
        appimages.find_source_root(module=tmp_path / "site-packages/rankpack/x.py")


# -- images/install-code.py ------------------------------------------------------------------


def test_install_code_lays_out_the_package_like_its_wheel(checkout: Path, tmp_path: Path) -> None:
    pkg = checkout / "src" / "rankpack"
    (pkg / "_lib").mkdir()
    (pkg / "_lib" / "librankpack_pmpi.openmpi.so").write_bytes(b"\x7fELF")
    (pkg / "_lib" / "librankpack_pmpi.openmpi.so").chmod(0o755)
    (pkg / "notes.txt").write_text("not package data")
    (pkg / "scratch").mkdir()
    (pkg / "scratch" / "x.py").write_text("")  # no __init__.py: not a package
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "old.cpython-311.pyc").write_bytes(b"")
    venv = install_code.install(checkout, tmp_path / "stage", "3.11")
    assert venv == tmp_path / "stage/opt/rankpack"
    site = venv / "lib/python3.11/site-packages"
    files = sorted(
        str(p.relative_to(site)) for p in site.rglob("*") if p.is_file() and p.suffix != ".pyc"
    )
    assert files == [
        "rankpack-0.1.0.dist-info/INSTALLER",
        "rankpack-0.1.0.dist-info/METADATA",
        "rankpack-0.1.0.dist-info/RECORD",
        "rankpack-0.1.0.dist-info/entry_points.txt",
        "rankpack-0.1.0.dist-info/top_level.txt",
        "rankpack/__init__.py",
        "rankpack/_lib/librankpack_pmpi.openmpi.so",
        "rankpack/cli/__init__.py",
        "rankpack/py.typed",
    ]
    assert (site / "rankpack/_lib/librankpack_pmpi.openmpi.so").stat().st_mode & 0o777 == 0o755
    assert (site / "rankpack/__init__.py").stat().st_mode & 0o777 == 0o644
    with open(REPO / "pyproject.toml", "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert sorted(p.name for p in (venv / "bin").iterdir()) == sorted(scripts)
    assert {"rankpack", "rankpack-exec", "rankpack-launcher"} <= set(scripts)
    script = (venv / "bin/rankpack").read_text()
    assert (
        script.startswith("#!/opt/rankpack/bin/python\n")
        and "from rankpack.cli import entry" in script
    )
    assert (venv / "bin/rankpack").stat().st_mode & 0o777 == 0o755
    metadata = (site / "rankpack-0.1.0.dist-info/METADATA").read_text()
    assert "Name: rankpack\nVersion: 0.1.0\n" in metadata and "Requires-Dist: rich>=13" in metadata
    record = (site / "rankpack-0.1.0.dist-info/RECORD").read_text()
    assert "../../../bin/rankpack,sha256=" in record and "rankpack/py.typed,sha256=" in record


def test_install_code_script_text() -> None:
    assert install_code.script_text("a.b:c.d", "/p") == (
        "#!/p/bin/python\nimport sys\nfrom a.b import c\n\n"
        'if __name__ == "__main__":\n    sys.exit(c.d())\n'
    )


# -- an interrupted build leaves no half cache -----------------------------------------------


def test_an_interrupted_base_build_leaves_nothing(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(applayers, "pipeline", interrupted)
    monkeypatch.setattr(applayers, "host_apt_source_files", lambda: {"a.sources": HOST_DEB822})
    parent = tmp_path / "cache" / "base"
    parent.mkdir(parents=True)
    dest = parent / "rank-0123"
    with pytest.raises(KeyboardInterrupt):
        applayers.build_base(checkout, RANK, "0123", dest, tmp_path / "log")
    assert list(parent.iterdir()) == []


def test_a_failed_code_layer_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps: list[str] = []

    def run(argv: list[str], log: Path, timeout_s: float = 120) -> None:
        steps.append(argv[1])
        if argv[1] == "config":
            raise UserError("image build step umoci failed; see log")

    monkeypatch.setattr(applayers, "run_step", run)
    base = tmp_path / "base" / "rank-0123"
    (base / "oci" / "blobs" / "sha256").mkdir(parents=True)
    (base / "oci" / "blobs" / "sha256" / "ab").write_bytes(b"layer")
    (base / "oci" / "index.json").write_text("{}")
    (base / "base.json").write_text('{"base_key": "0123", "unpacked_bytes": 10}')
    parent = tmp_path / "dev"
    parent.mkdir()
    config = imagerecipe.image_config(RANK, "0.1.0", "0" * 64, "c" * 64)
    with pytest.raises(UserError):
        applayers.assemble(
            RANK, base, (tmp_path / "code.tar", 1), config, parent / "rank-x", tmp_path / "l"
        )
    assert steps == ["raw", "config"]
    assert list(parent.iterdir()) == []
    # The base's blobs were hard-linked, never changed.
    assert (base / "oci" / "blobs" / "sha256" / "ab").read_bytes() == b"layer"


def test_the_code_layer_tar_is_root_owned_sorted_and_complete(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    (stage / "opt/rankpack/bin").mkdir(parents=True)
    (stage / "opt/rankpack/bin/rankpack").write_text("#!/opt/rankpack/bin/python\n")
    (stage / "opt/rankpack/bin/rankpack").chmod(0o755)
    (stage / "opt/rankpack/x.py").write_text("x = 1\n")
    layer = tmp_path / "code.tar"
    assert applayers.code_layer(stage, layer) == 27 + 6
    with tarfile.open(layer) as tar:  # reads to the end-of-archive blocks
        members = tar.getmembers()
    assert [m.name for m in members] == [
        "opt",
        "opt/rankpack",
        "opt/rankpack/bin",
        "opt/rankpack/bin/rankpack",
        "opt/rankpack/x.py",
    ]
    assert {(m.uid, m.gid, m.uname, m.mtime) for m in members} == {
        (0, 0, "root", applayers.LAYER_MTIME)
    }
    assert members[3].mode == 0o755 and members[4].mode & 0o777 == 0o644
