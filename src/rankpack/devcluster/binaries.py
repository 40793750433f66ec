"""Kubernetes binaries for the dev cluster, built from the Go module proxy and cached by version.

Called by `rankpack.devcluster.lifecycle.bringup.up` (build or reuse before starting
anything) and by `setup.sh test` (``python -m rankpack.devcluster.binaries`` so the test
tier finds them ready).

There is no release download here: only package registries are reachable. The Go module
proxy serves `k8s.io/kubernetes` and every staging module it replaces (`k8s.io/api`, ...), so a
throw-away module that requires `k8s.io/kubernetes vX.Y.Z` and replaces each staging module
with the published `k8s.io/<name> v0.Y.Z` builds the commands. The module is generated in a
temporary directory; nothing of it is kept but the binaries.

The cache lives outside any checkout, keyed by version::

    /var/cache/rankpack/kubernetes/v1.36.3/bin/{kube-apiserver,...}
    /var/cache/rankpack/go/{mod,build}          GOMODCACHE, GOCACHE (cheap rebuilds)
    /var/cache/rankpack/go/toolchain/go1.X.Y/  a Go toolchain, if the machine lacks one

A build writes into a temporary sibling directory and renames it into place, so an
interrupted build never leaves a half-filled ``bin/``.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rankpack.errors import UserError

DEFAULT_VERSION = "v1.36.3"
CACHE_ROOT = Path(os.environ.get("RANKPACK_CACHE", "/var/cache/rankpack"))


def _go_proxy() -> str:
    """The first HTTP(S) entry of $GOPROXY (a site mirror), else the public proxy."""
    for entry in os.environ.get("GOPROXY", "").replace("|", ",").split(","):
        if entry.startswith(("https://", "http://")):
            return entry.rstrip("/")
    return "https://proxy.golang.org"


GO_PROXY = _go_proxy()
# Go release used when the machine has no Go new enough for the Kubernetes go.mod.
BOOTSTRAP_GO = "go1.26.11"

# The commands the dev cluster runs, plus kubectl for people poking at the cluster.
COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")

# Staging modules that are not published on the proxy (nothing in the build needs them).
UNPUBLISHED_STAGING = frozenset({"k8s.io/sample-cli-plugin"})

_VERSION_RE = re.compile(r"^v1\.(\d+)\.(\d+)$")
_GO_VERSION_RE = re.compile(r"go(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class KubeVersion:
    """A Kubernetes release `v1.MINOR.PATCH` and the matching staging module version."""

    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> KubeVersion:
        m = _VERSION_RE.match(text.strip())
        if not m:
            raise UserError(f"--version {text!r} is not a Kubernetes release like v1.36.3")
        version = cls(int(m.group(1)), int(m.group(2)))
        if version.minor < 35:
            raise UserError(
                f"--version {text}: the dev cluster needs Kubernetes >= v1.35 "
                "(in-place pod resize is GA from 1.35)"
            )
        return version

    @property
    def tag(self) -> str:
        return f"v1.{self.minor}.{self.patch}"

    @property
    def staging_tag(self) -> str:
        return f"v0.{self.minor}.{self.patch}"


def bin_dir(version: KubeVersion, cache_root: Path = CACHE_ROOT) -> Path:
    return cache_root / "kubernetes" / version.tag / "bin"


def cached(version: KubeVersion, cache_root: Path = CACHE_ROOT) -> bool:
    d = bin_dir(version, cache_root)
    return all((d / c).is_file() and os.access(d / c, os.X_OK) for c in COMMANDS)


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The module paths the `replace` block of kubernetes' go.mod points at ./staging/."""
    names: list[str] = []
    in_block = False
    for raw in kubernetes_go_mod.splitlines():
        line = raw.strip()
        if line.startswith("replace ("):
            in_block = True
            continue
        if in_block and line == ")":
            in_block = False
            continue
        single = line.startswith("replace ") and "=>" in line
        if (in_block or single) and "=>" in line:
            left, right = (part.strip() for part in line.removeprefix("replace ").split("=>", 1))
            if right.startswith("./staging/"):
                names.append(left.split()[0])
    return sorted(set(names))


def required_go(kubernetes_go_mod: str) -> tuple[int, int]:
    m = re.search(r"^go (\d+)\.(\d+)", kubernetes_go_mod, re.MULTILINE)
    if not m:
        raise UserError("kubernetes go.mod has no 'go' directive")
    return int(m.group(1)), int(m.group(2))


def build_module_go_mod(version: KubeVersion, staging: Sequence[str], go: tuple[int, int]) -> str:
    """go.mod text of the throw-away module: require kubernetes, replace staging modules."""
    lines = [
        "module rankpack.invalid/kubebuild",
        "",
        f"go {go[0]}.{go[1]}",
        "",
        f"require k8s.io/kubernetes {version.tag}",
        "",
        "replace (",
    ]
    lines += [
        f"\t{name} => {name} {version.staging_tag}"
        for name in staging
        if name not in UNPUBLISHED_STAGING
    ]
    lines += [")", ""]
    return "\n".join(lines)


def ldflags(version: KubeVersion) -> str:
    """-ldflags that strip the binaries and stamp the version (else the node reports v0.0.0)."""
    values = {"gitVersion": version.tag, "gitMajor": "1", "gitMinor": str(version.minor)}
    parts = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        parts += [f"-X {pkg}.{key}={value}" for key, value in values.items()]
    return " ".join(parts)


def _go_version(go: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [go, "env", "GOVERSION"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            env={**os.environ, "GOTOOLCHAIN": "local"},
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = _GO_VERSION_RE.search(out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _fetch(url: str, timeout_s: float = 300) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        data: bytes = resp.read()
    return data


def dirhash_h1(zip_bytes: bytes) -> str:
    """Go's `h1:` hash of a module zip (what the checksum database records)."""
    lines = []
    with zipfile.ZipFile(io.BytesIO(zip_bytes)) as zf:
        for name in sorted(zf.namelist()):
            if name.endswith("/"):
                continue
            lines.append(f"{hashlib.sha256(zf.read(name)).hexdigest()}  {name}\n")
    summary = hashlib.sha256("".join(lines).encode()).digest()
    return "h1:" + base64.b64encode(summary).decode()


def _bootstrap_go(cache_root: Path, release: str = BOOTSTRAP_GO) -> Path:
    """Fetch a Go toolchain from the module proxy (module `golang.org/toolchain`), verified
    against the checksum database served through the same proxy."""
    dest = cache_root / "go" / "toolchain" / release
    go = dest / "bin" / "go"
    if go.is_file():
        return go
    module_version = f"v0.0.1-{release}.linux-amd64"
    print(f"rankpack: fetching the Go toolchain {release} from the Go module proxy", flush=True)
    zip_bytes = _fetch(f"{GO_PROXY}/golang.org/toolchain/@v/{module_version}.zip")
    lookup = _fetch(
        f"{GO_PROXY}/sumdb/sum.golang.org/lookup/golang.org/toolchain@{module_version}", 60
    ).decode()
    expected = [
        ln.split()[2]
        for ln in lookup.splitlines()
        if ln.startswith(f"golang.org/toolchain {module_version} ")
    ]
    actual = dirhash_h1(zip_bytes)
    if expected != [actual]:
        raise UserError(f"Go toolchain {release}: checksum mismatch ({actual} vs {expected})")
    prefix = f"golang.org/toolchain@{module_version}/"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{release}-", dir=dest.parent))
    try:
        with zipfile.ZipFile(io.BytesIO(zip_bytes)) as zf:
            for info in zf.infolist():
                if not info.filename.startswith(prefix) or info.is_dir():
                    continue
                target = tmp / info.filename.removeprefix(prefix)
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                mode = (info.external_attr >> 16) & 0o777
                target.chmod(mode or 0o644)
        for exe in (tmp / "bin").iterdir():
            exe.chmod(0o755)
        for exe in (tmp / "pkg" / "tool").rglob("*"):
            if exe.is_file():
                exe.chmod(0o755)
        os.rename(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return go


def find_go(need: tuple[int, int], cache_root: Path = CACHE_ROOT) -> Path:
    """A `go` at least `need`: $GO, PATH, /usr/local/go, our cache; else bootstrap one."""
    candidates = [os.environ.get("GO", ""), shutil.which("go") or "", "/usr/local/go/bin/go"]
    candidates += [str(p) for p in sorted((cache_root / "go" / "toolchain").glob("go*/bin/go"))]
    for c in candidates:
        if c and Path(c).is_file():
            have = _go_version(c)
            if have is not None and have >= need:
                return Path(c)
    return _bootstrap_go(cache_root)


def go_env(go: Path, cache_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "GOMODCACHE": str(cache_root / "go" / "mod"),
            "GOCACHE": str(cache_root / "go" / "build"),
            "GOPATH": str(cache_root / "go" / "path"),
            "GOPROXY": GO_PROXY,
            "GOFLAGS": "-mod=mod -buildvcs=false",
            "GOTOOLCHAIN": "local",
            "CGO_ENABLED": "0",
            "PATH": f"{go.parent}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    env.pop("GOROOT", None)
    return env


def ensure(
    version: KubeVersion,
    cache_root: Path = CACHE_ROOT,
    log: Path | None = None,
    timeout_s: float = 3600,
) -> Path:
    """Return the directory holding the cached binaries, building them first if needed."""
    if cached(version, cache_root):
        return bin_dir(version, cache_root)
    if os.geteuid() != 0 and not os.access(cache_root.parent, os.W_OK):
        raise UserError(f"cannot write the binary cache {cache_root}: run as root")
    target = bin_dir(version, cache_root)
    target.parent.mkdir(parents=True, exist_ok=True)
    # One build per version at a time; under the lock, what a killed build left is stale.
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cached(version, cache_root):
            return target
        for stale in target.parent.glob(".build-*"):
            shutil.rmtree(stale, ignore_errors=True)
        return _build(version, cache_root, target, log, timeout_s)


def _build(
    version: KubeVersion, cache_root: Path, target: Path, log: Path | None, timeout_s: float
) -> Path:
    go_mod_text = _fetch(f"{GO_PROXY}/k8s.io/kubernetes/@v/{version.tag}.mod", 60).decode()
    go = find_go(required_go(go_mod_text), cache_root)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    log = log or target.parent / "build.log"
    started = time.monotonic()
    print(
        f"rankpack: building Kubernetes {version.tag} ({', '.join(COMMANDS)}) with {go}; "
        f"about 10 minutes on 2 cores, once per version (log: {log})",
        flush=True,
    )
    try:
        module = work / "module"
        module.mkdir()
        staging = staging_modules(go_mod_text)
        (module / "go.mod").write_text(
            build_module_go_mod(version, staging, required_go(go_mod_text))
        )
        packages = [f"k8s.io/kubernetes/cmd/{c}" for c in COMMANDS]
        env = go_env(go, cache_root)
        out_dir = work / "bin"
        out_dir.mkdir()
        build = [str(go), "build", "-trimpath", "-ldflags", ldflags(version)]
        steps = [
            [str(go), "get", *(f"{p}@{version.tag}" for p in packages)],
            [*build, "-o", str(out_dir), *packages],
        ]
        with open(log, "w") as log_file:
            for argv in steps:
                log_file.write(f"$ {' '.join(argv)}\n")
                log_file.flush()
                remaining = timeout_s - (time.monotonic() - started)
                try:
                    proc = subprocess.run(
                        argv,
                        cwd=module,
                        env=env,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        timeout=max(remaining, 1),
                        check=False,
                    )
                except subprocess.TimeoutExpired as exc:
                    raise UserError(f"building Kubernetes timed out; see {log}") from exc
                if proc.returncode != 0:
                    raise UserError(f"building Kubernetes {version.tag} failed; see {log}")
        missing = [c for c in COMMANDS if not (out_dir / c).is_file()]
        if missing:
            raise UserError(f"build produced no {', '.join(missing)}; see {log}")
        if target.exists():  # a concurrent build won; keep its result
            return target
        os.rename(out_dir, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"rankpack: built in {time.monotonic() - started:.0f} s -> {target}", flush=True)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m rankpack.devcluster.binaries [VERSION]`: build or reuse (for setup.sh)."""
    args = list(sys.argv[1:] if argv is None else argv)
    version = KubeVersion.parse(args[0] if args else DEFAULT_VERSION)
    try:
        path = ensure(version)
    except UserError as exc:
        print(f"rankpack: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
