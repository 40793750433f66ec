"""What rankpack's two images are made of: pure values and functions, no side effects.

Used by `rankpack.devcluster.appimages`, which builds and caches the images:

- `TARGETS`: each image's reference, the install steps of its base, its extra environment;
- `base_key`, `code_key`: the cache keys of the two layers (they read files, nothing else);
- `image_config` and `umoci_config_argv`: the OCI config (user, env, workdir, labels);
- `apt_sources`, `build_env`, `mmdebstrap_argv`: how the base is bootstrapped, from this
  host's apt entries for the suite and with its pip index / proxy / CA settings.

The recipe itself is in the checkout's ``images/`` (package lists, install-rootfs.sh,
dpkg.cfg, install-code.py), which images/Containerfile uses too.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rankpack.errors import UserError

RANKPACK_IMAGE = "rankpack.local/rankpack:dev"
RANK_IMAGE = "rankpack.local/rank:dev"
SUITE = "bookworm"
"""Debian 12: the Containerfile's ``FROM debian:bookworm-slim``, and this host's release
(the shim libraries are built here and must match the image's Open MPI and MPICH)."""
RECIPE = "mmdebstrap-minbase-1"
"""Part of every base key: change it when the builder (`mmdebstrap_argv`, the layer made of
its output) changes what a base holds."""

PREFIX = "/opt/rankpack"
HOME = "/home/rankpack"
USER = "1000:1000"
PATH = f"{PREFIX}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What `rankpack.case.openfoam.foam_env` sets on a Debian host, set in the image instead.
FOAM_ENV = (
    ("WM_PROJECT_DIR", "/usr/share/openfoam"),
    ("LD_LIBRARY_PATH", "/usr/lib/openmpi-system"),
)
IN_ROOTFS = "/tmp/rankpack-images"
"""Where the install script and its inputs are copied inside the root filesystem."""
# Host variables pip inside the build may need (a site's index mirror, a proxy).
PIP_PASSTHROUGH = (
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_DEFAULT_TIMEOUT",
    "PIP_RETRIES",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
)
CA_CANDIDATES = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")
DEFAULT_CA = "/etc/ssl/certs/ca-certificates.crt"


@dataclass(frozen=True)
class Target:
    """One image: its reference, which install steps its base runs, its extra environment."""

    name: str
    ref: str
    steps: tuple[str, ...]
    """Package lists / install-rootfs.sh targets, in order (rank = rankpack's, then rank's)."""
    env: tuple[tuple[str, str], ...] = ()


TARGETS = (
    Target("rankpack", RANKPACK_IMAGE, ("rankpack",)),
    Target("rank", RANK_IMAGE, ("rankpack", "rank"), FOAM_ENV),
)


def target(name: str) -> Target:
    for t in TARGETS:
        if t.name == name:
            return t
    raise UserError(f"no image {name!r}: the images are {', '.join(t.name for t in TARGETS)}")


# -- keys (pure: read files, start nothing) -------------------------------------------------


def package_names(text: str) -> list[str]:
    """The packages of a list file: one per line (or several), ``#`` starts a comment."""
    return [word for line in text.splitlines() for word in line.split("#", 1)[0].split()]


def dependencies(pyproject: Path) -> list[str]:
    with open(pyproject, "rb") as f:
        deps: list[str] = tomllib.load(f)["project"]["dependencies"]
    return deps


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def base_inputs(source_root: Path, t: Target) -> list[Path]:
    """The files a base is made from (copied into the root filesystem for the script)."""
    images = source_root / "images"
    lists = [images / "packages" / f"{step}.txt" for step in t.steps]
    return [
        images / "install-rootfs.sh",
        images / "dpkg.cfg",
        *lists,
        source_root / "pyproject.toml",
    ]


def base_key(source_root: Path, t: Target, suite: str = SUITE) -> str:
    """Hash of what the base holds: suite, packages, install script, dpkg filters and the
    dependency list. Comments in the lists and the rest of pyproject.toml do not count."""
    images = source_root / "images"
    try:
        described = {
            "recipe": RECIPE,
            "suite": suite,
            "steps": list(t.steps),
            "packages": {
                step: package_names((images / "packages" / f"{step}.txt").read_text())
                for step in t.steps
            },
            "install-rootfs.sh": _sha256((images / "install-rootfs.sh").read_bytes()),
            "dpkg.cfg": _sha256((images / "dpkg.cfg").read_bytes()),
            "dependencies": dependencies(source_root / "pyproject.toml"),
        }
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{source_root} is not a rankpack checkout with images/: {exc}") from exc
    return _sha256(json.dumps(described, sort_keys=True).encode())


def _skipped(rel: Path) -> bool:
    parts = rel.parts
    return (
        "__pycache__" in parts
        or rel.suffix == ".pyc"
        or any(p.endswith(".egg-info") for p in parts)
        or parts[:3] == ("src", "rankpack", "_lib")  # built from shim/, tools/ (which count)
        or parts[:2] == ("shim", "build")
    )


def code_files(source_root: Path) -> list[Path]:
    """The files the code layer is made from, relative to the checkout, sorted."""
    found = [Path("pyproject.toml"), Path("images/install-code.py")]
    for top in ("src", "shim", "tools"):
        for path in sorted((source_root / top).rglob("*")):
            rel = path.relative_to(source_root)
            if path.is_file() and not _skipped(rel):
                found.append(rel)
    return sorted(found)


def code_key(source_root: Path) -> str:
    h = hashlib.sha256()
    for rel in code_files(source_root):
        h.update(f"{rel}\0".encode())
        h.update(_sha256((source_root / rel).read_bytes()).encode())
    return h.hexdigest()


# -- image config ------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageConfig:
    user: str
    env: tuple[tuple[str, str], ...]
    workdir: str
    cmd: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]


def image_config(t: Target, version: str, base: str, code: str) -> ImageConfig:
    """The OCI config of an image (numeric user, so that runAsNonRoot can be checked)."""
    env = (("PATH", PATH), ("HOME", HOME), ("LANG", "C.UTF-8"), *t.env)
    labels = (
        ("org.opencontainers.image.title", f"rankpack/{t.name}"),
        ("org.opencontainers.image.version", version),
        ("dev.rankpack.base-key", base[:16]),
        ("dev.rankpack.code-key", code[:16]),
    )
    return ImageConfig(USER, env, HOME, ("rankpack", "--help"), labels)


def umoci_config_argv(umoci: str, image: str, config: ImageConfig) -> list[str]:
    argv = [umoci, "config", "--image", image, "--config.user", config.user]
    for key, value in config.env:
        argv += ["--config.env", f"{key}={value}"]
    argv += ["--config.workingdir", config.workdir]
    for part in config.cmd:
        argv += ["--config.cmd", part]
    for key, value in config.labels:
        argv += ["--config.label", f"{key}={value}"]
    return argv


# -- apt sources and pip's environment (pure) -----------------------------------------------

_ONE_LINE_OPTIONS = {"arch": "Architectures", "lang": "Languages", "target": "Targets"}


def _suite_matches(suite: str, wanted: str) -> bool:
    return suite == wanted or suite.startswith((f"{wanted}-", f"{wanted}/"))


def _deb822_stanzas(text: str) -> list[list[tuple[str, str]]]:
    """Stanzas of a deb822 file as (field, value) lists; continuation lines kept."""
    stanzas: list[list[tuple[str, str]]] = []
    fields: list[tuple[str, str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if fields:
                stanzas.append(fields)
            fields = []
        elif line[0] in " \t" and fields:
            key, value = fields[-1]
            fields[-1] = (key, f"{value}\n{line}")
        elif ":" in line:
            key, value = line.split(":", 1)
            fields.append((key.strip(), value.strip()))
    return stanzas


def _one_line_stanzas(text: str) -> list[list[tuple[str, str]]]:
    stanzas = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        options: list[tuple[str, str]] = []
        rest = words[1:]
        if rest and rest[0].startswith("["):
            opts: list[str] = []
            while rest:
                word = rest.pop(0)
                opts.append(word.strip("[]"))
                if word.endswith("]"):
                    break
            for opt in filter(None, opts):
                key, _, value = opt.partition("=")
                if key.endswith(("+", "-")):
                    continue
                options.append((_ONE_LINE_OPTIONS.get(key, key), value.replace(",", " ")))
        if len(rest) < 2:
            continue
        uri, suite, *components = rest
        stanzas.append(
            [
                ("Types", "deb"),
                ("URIs", uri),
                ("Suites", suite),
                ("Components", " ".join(components)),
                *options,
            ]
        )
    return stanzas


def apt_sources(files: Mapping[str, str], suite: str = SUITE) -> str:
    """A deb822 sources file with the host's entries for ``suite`` (and its -updates,
    -security): ``files`` maps each apt source file's name to its text (``*.sources`` in
    deb822 form, ``*.list`` / ``sources.list`` one entry per line). Disabled entries,
    deb-src and other suites (third-party repositories) are left out."""
    out: list[str] = []
    for name in sorted(files):
        text = files[name]
        stanzas = _deb822_stanzas(text) if name.endswith(".sources") else _one_line_stanzas(text)
        for fields in stanzas:
            get = {k.lower(): v for k, v in fields}
            if get.get("enabled", "yes").strip().lower() == "no":
                continue
            if "deb" not in get.get("types", "").split():
                continue
            suites = [s for s in get.get("suites", "").split() if _suite_matches(s, suite)]
            if not suites:
                continue
            lines = []
            for key, value in fields:
                if key.lower() == "types":
                    value = "deb"
                elif key.lower() == "suites":
                    value = " ".join(suites)
                elif key.lower() == "enabled":
                    continue
                lines.append(f"{key}: {value}")
            out.append("\n".join(lines))
    return "\n\n".join(out) + ("\n" if out else "")


def host_apt_source_files(apt_dir: Path = Path("/etc/apt")) -> dict[str, str]:
    files: dict[str, str] = {}
    candidates = [apt_dir / "sources.list"]
    candidates += sorted((apt_dir / "sources.list.d").glob("*.list"))
    candidates += sorted((apt_dir / "sources.list.d").glob("*.sources"))
    for path in candidates:
        if path.is_file():
            files[path.name] = path.read_text(errors="replace")
    return files


def host_ca_bundle(environ: Mapping[str, str]) -> Path | None:
    """The CA bundle this host's pip trusts (a site's TLS-inspecting proxy included)."""
    for name in CA_CANDIDATES:
        value = environ.get(name, "")
        if value and Path(value).is_file():
            return Path(value)
    return Path(DEFAULT_CA) if Path(DEFAULT_CA).is_file() else None


def build_env(environ: Mapping[str, str], with_ca: bool) -> dict[str, str]:
    """mmdebstrap's environment, which its hooks and the install script inherit: a clean
    one, plus the host's pip index and proxy settings and, inside the root filesystem, the
    copy of the host's CA bundle (removed with the script's inputs)."""
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LC_ALL": "C.UTF-8",
    }
    env.update({k: environ[k] for k in PIP_PASSTHROUGH if environ.get(k)})
    if with_ca:
        env["PIP_CERT"] = f"{IN_ROOTFS}/host-ca.crt"
    return env


def mmdebstrap_argv(
    t: Target,
    packages: Sequence[str],
    inputs: Path,
    sources: Path,
    python_out: Path,
    suite: str = SUITE,
) -> list[str]:
    """mmdebstrap writing the base's root filesystem as a tar to stdout."""
    script = f"{IN_ROOTFS}/install-rootfs.sh"
    venv_python = f"{PREFIX}/bin/python"
    hooks = [
        f'mkdir -p "$1"{IN_ROOTFS} && cp -a {shlex.quote(str(inputs))}/. "$1"{IN_ROOTFS}/',
        *(f'chroot "$1" sh {script} {step}' for step in t.steps),
        # The venv's Python X.Y, for the code layer's site-packages path.
        f'chroot "$1" {venv_python} -c "import sys; print(*sys.version_info[:2], sep=chr(46))"'
        f" > {shlex.quote(str(python_out))}",
        # No build input, host name, resolver or duplicate dpkg config stays in the image.
        f'rm -rf "$1"{IN_ROOTFS} "$1"/etc/dpkg/dpkg.cfg.d/99mmdebstrap'
        ' "$1"/etc/resolv.conf "$1"/etc/hostname',
    ]
    argv = [
        "mmdebstrap",
        "--mode=root",
        "--variant=minbase",
        "--format=tar",
        f"--include={','.join(packages)}",
        f"--dpkgopt={inputs / 'dpkg.cfg'}",
    ]
    argv += [f"--customize-hook={hook}" for hook in hooks]
    return [*argv, suite, "-", str(sources)]
