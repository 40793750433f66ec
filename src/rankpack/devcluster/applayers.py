"""The build steps of rankpack's two container images: the BASE (`build_base`: mmdebstrap's
root filesystem as an OCI layer), the CODE layer (`build_code`, `code_layer`) and the image
assembled from both with its config (`assemble`).

Called by `rankpack.devcluster.appimages` (which keys, caches, locks and prunes them); what
the images are made of is `rankpack.devcluster.imagerecipe`, pure. Each step builds in a
``.tmp-*`` sibling of its destination and renames it into place, so an interrupted build
leaves no half cache. `pipeline` and `tar_file_bytes` serve the test images too
(`rankpack.devcluster.testimages`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from rankpack.devcluster import toolsbuild
from rankpack.devcluster.imagerecipe import (
    SUITE,
    ImageConfig,
    Target,
    apt_sources,
    base_inputs,
    build_env,
    host_apt_source_files,
    host_ca_bundle,
    mmdebstrap_argv,
    package_names,
    umoci_config_argv,
)
from rankpack.devcluster.images import run_step
from rankpack.devcluster.packages import tool
from rankpack.errors import UserError

BASE_TIMEOUT_S = 1800.0


def pipeline(
    first: list[str],
    second: list[str],
    out: Path,
    log: Path,
    timeout_s: float,
    env: Mapping[str, str],
) -> None:
    """``first | second > out``; stderr of both into ``log``. SIGTERM, then SIGKILL, on
    timeout (mmdebstrap cleans its own chroot up on SIGTERM)."""
    with open(log, "a") as err, open(out, "wb") as sink:
        err.write(f"$ {shlex.join(first)} | {shlex.join(second)} > {out}\n")
        err.flush()
        p1 = subprocess.Popen(first, stdout=subprocess.PIPE, stderr=err, env=dict(env))
        p2 = subprocess.Popen(second, stdin=p1.stdout, stdout=sink, stderr=err)
        assert p1.stdout is not None
        p1.stdout.close()
        deadline = time.monotonic() + timeout_s
        try:
            for proc in (p1, p2):
                proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except BaseException as exc:  # the timeout, Ctrl-C, SIGTERM: stop both, then say so
            for proc in (p1, p2):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in (p1, p2):
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if isinstance(exc, subprocess.TimeoutExpired):
                raise UserError(
                    f"image build step {Path(first[0]).name} took over {timeout_s:.0f} s; see {log}"
                ) from exc
            raise
    if p1.returncode != 0 or p2.returncode != 0:
        raise UserError(f"image build step {Path(first[0]).name} failed; see {log}")


def tar_file_bytes(path: Path) -> int:
    with tarfile.open(path) as tar:
        return sum(m.size for m in tar if m.isfile())


def _stage_inputs(source_root: Path, t: Target, inputs: Path) -> bool:
    """Copy the base's inputs (and the host's CA bundle, if any) into ``inputs``, where the
    script finds them; True if the CA bundle is among them."""
    (inputs / "packages").mkdir(parents=True)
    for path in base_inputs(source_root, t):
        rel = path.relative_to(source_root)
        target_path = inputs / (rel.relative_to("images") if rel.parts[0] == "images" else rel)
        shutil.copyfile(path, target_path)
    ca = host_ca_bundle(os.environ)
    if ca is not None:
        shutil.copyfile(ca, inputs / "host-ca.crt")
    return ca is not None


def _layer_of_rootfs(t: Target, rootfs_tar: Path, layout: Path, log: Path) -> None:
    """An OCI layout at ``layout`` whose image ``base`` is the root filesystem's one layer."""
    umoci = tool("umoci")
    run_step([umoci, "init", "--layout", str(layout)], log)
    run_step([umoci, "new", "--image", f"{layout}:base"], log)
    run_step(
        [
            umoci,
            "raw",
            "add-layer",
            "--image",
            f"{layout}:base",
            "--history.created_by",
            f"mmdebstrap {SUITE} minbase + install-rootfs.sh {' '.join(t.steps)}",
            str(rootfs_tar),
        ],
        log,
        timeout_s=600,
    )
    run_step([umoci, "gc", "--layout", str(layout)], log)


def build_base(source_root: Path, t: Target, key: str, dest: Path, log: Path) -> dict[str, object]:
    """Build the base of ``t`` into ``dest`` (an OCI layout at dest/oci, tag "base", and
    dest/base.json). ``dest`` must not exist; it appears whole or not at all."""
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{t.name}-", dir=dest.parent))
    try:
        inputs = work / "inputs"
        with_ca = _stage_inputs(source_root, t, inputs)
        sources = work / "debian.sources"
        sources.write_text(apt_sources(host_apt_source_files()))
        if not sources.read_text().strip():
            raise UserError(f"this host's apt sources (/etc/apt) have no entry for {SUITE}")
        packages = [
            p
            for step in t.steps
            for p in package_names((inputs / "packages" / f"{step}.txt").read_text())
        ]
        python_out = work / "python-version"
        rootfs_tar = work / "rootfs.tar"
        argv = mmdebstrap_argv(t, packages, inputs, sources, python_out)
        argv[0] = tool("mmdebstrap")
        pipeline(
            argv,
            [tool("mmtarfilter"), "--path-exclude=/dev/*"],
            rootfs_tar,
            log,
            BASE_TIMEOUT_S,
            build_env(os.environ, with_ca),
        )
        python = python_out.read_text().strip()
        if not re.fullmatch(r"\d+\.\d+", python):
            raise UserError(f"the base's venv reported Python {python!r}; see {log}")
        _layer_of_rootfs(t, rootfs_tar, work / "oci", log)
        meta: dict[str, object] = {
            "target": t.name,
            "base_key": key,
            "suite": SUITE,
            "python": python,
            "packages": packages,
            "unpacked_bytes": tar_file_bytes(rootfs_tar),
            "seconds": round(time.monotonic() - started, 1),
        }
        shutil.rmtree(inputs)  # the copy of the host's CA bundle among them
        for leftover in (rootfs_tar, sources, python_out):
            leftover.unlink()
        (work / "base.json").write_text(json.dumps(meta, indent=2) + "\n")
        work.chmod(0o755)
        os.rename(work, dest)
        return meta
    finally:
        shutil.rmtree(work, ignore_errors=True)


LAYER_MTIME = 946684800
"""Modification time of every entry of the code layer (2000-01-01): the same code gives the
same layer digest. The .pyc files are hash-checked, so they do not depend on it."""


def code_layer(stage: Path, out: Path) -> int:
    """A layer tar of ``stage``'s tree (``opt/rankpack/...``): entries owned by root, sorted,
    with the files' modes and `LAYER_MTIME`. Returns the bytes of its files.

    Written here rather than by ``umoci insert``: umoci 0.4.7's insert ends its layer
    without the tar's last padding and end-of-archive blocks, which GNU tar and Python
    refuse ("unexpected EOF") and containerd's unpacking would too."""
    total = 0
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(stage.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(stage)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = LAYER_MTIME
            if info.isfile():
                total += info.size
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return total


def build_code(source_root: Path, python: str, work: Path, log: Path) -> tuple[Path, int]:
    """The shim (``make -C shim install``), ``rankpack-tools`` (`toolsbuild`) and
    install-code.py's tree, as a layer tar in ``work``; returns it and the bytes of its
    files."""
    run_step([tool("make"), "-s", "-C", str(source_root / "shim"), "install"], log, timeout_s=300)
    toolsbuild.build(source_root)
    libs = source_root / "src" / "rankpack" / "_lib"
    for flavour in ("openmpi", "mpich"):
        if not (libs / f"librankpack_pmpi.{flavour}.so").is_file():
            raise UserError(f"make -C shim install built no {flavour} shim library; see {log}")
    stage = work / "stage"
    installer = source_root / "images" / "install-code.py"
    argv = [sys.executable, str(installer), "--source", str(source_root), "--root", str(stage)]
    run_step([*argv, "--python", python], log)
    layer = work / "code.tar"
    return layer, code_layer(stage, layer)


def _link_tree(src: Path, dest: Path) -> None:
    """Copy an OCI layout, hard-linking the (immutable, content-addressed) blobs."""
    shutil.copytree(src, dest, copy_function=_link_or_copy)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def assemble(
    t: Target,
    base_dir: Path,
    code: tuple[Path, int],
    config: ImageConfig,
    dest: Path,
    log: Path,
) -> dict[str, object]:
    """The base + the code layer + the config: dest/image.tar (tag "dev") and
    dest/image.json. ``dest`` appears whole or not at all."""
    code_tar, code_bytes = code
    _name, _, tag = t.ref.rpartition(":")
    base = json.loads((base_dir / "base.json").read_text())
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{t.name}-", dir=dest.parent))
    try:
        layout = work / "oci"
        _link_tree(base_dir / "oci", layout)
        umoci = tool("umoci")
        add = [umoci, "raw", "add-layer", "--image", f"{layout}:base", "--tag", tag]
        run_step([*add, "--history.created_by", "install-code.py", str(code_tar)], log)
        run_step(umoci_config_argv(umoci, f"{layout}:{tag}", config), log)
        run_step([umoci, "rm", "--image", f"{layout}:base"], log)
        run_step([umoci, "gc", "--layout", str(layout)], log)
        archive = work / "image.tar"
        with tarfile.open(archive, "w") as tar:
            for entry in sorted(layout.iterdir()):
                tar.add(entry, arcname=entry.name)
        shutil.rmtree(layout)
        meta: dict[str, object] = {
            "target": t.name,
            "ref": t.ref,
            "base_key": base["base_key"],
            "code_key": dict(config.labels)["dev.rankpack.code-key"],
            "archive_bytes": archive.stat().st_size,
            "unpacked_bytes": int(base["unpacked_bytes"]) + code_bytes,
        }
        (work / "image.json").write_text(json.dumps(meta, indent=2) + "\n")
        work.chmod(0o755)
        os.rename(work, dest)
        return meta
    finally:
        shutil.rmtree(work, ignore_errors=True)
