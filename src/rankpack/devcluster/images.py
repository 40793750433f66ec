"""Container images for the dev cluster, built locally (there is no registry to pull from).

Called by `rankpack.devcluster.lifecycle.bringup.up` once containerd runs:

- `PAUSE_IMAGE`: the pod sandbox, a static C program that sleeps until SIGTERM/SIGINT and
  reaps children; containerd's ``sandbox_image`` names it.
- `HOST_USR_IMAGE`: an empty root filesystem whose ``bin lib lib64 sbin`` link into
  ``usr/`` (this host is merged-/usr) plus copies of /etc/passwd, /etc/group,
  /etc/alternatives and /etc/openmpi. A pod mounts the host's /usr read-only over ``/usr``
  and so runs the host's OpenFOAM and Open MPI. On a real cluster a real image replaces it.

Each image is an OCI layout made with umoci, archived with tar and imported with
``ctr -n k8s.io images import`` into every node's containerd; pods use
``imagePullPolicy: Never``. The archives stay in ``<state>/images/archives`` (listed in its
``index.json``) so that `start-node` can import them into a node that comes back empty;
`register_archive` adds an image built elsewhere (the rankpack images of ``up --operator``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

from rankpack.devcluster.layout import HOST_USR_IMAGE, PAUSE_IMAGE, Layout, NodeLayout
from rankpack.devcluster.packages import tool
from rankpack.errors import UserError

IMPORT_TIMEOUT_S = 600.0
"""A large image (the rank image: ~1.3 GB unpacked) into one node's containerd."""

PAUSE_C = r"""/* rankpack dev-cluster pod sandbox: hold the pod's namespaces, reap orphans. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }
static void on_child(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    signal(SIGCHLD, on_child);
    for (;;) pause();
}
"""

HOST_ETC_COPIES = ("passwd", "group", "alternatives", "openmpi", "ld.so.cache", "ld.so.conf")
MERGED_USR_LINKS = ("bin", "lib", "lib64", "sbin")


def run_step(argv: list[str], log: Path, timeout_s: float = 120) -> None:
    """Run one image build step, its output appended to ``log``; a failure is a one-line
    `UserError` naming the log. Also `applayers`' steps (rankpack's own images)."""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
        )
    if proc.returncode != 0:
        raise UserError(f"image build step {argv[0]} failed; see {log}")


def _split_ref(ref: str) -> tuple[str, str]:
    name, _, tag = ref.rpartition(":")
    return name, tag


def build_image(
    ref: str, rootfs_files: Path, workdir: Path, log: Path, entrypoint: list[str] | None
) -> Path:
    """An OCI archive (tar of an OCI layout) with one layer holding `rootfs_files`' tree."""
    umoci = tool("umoci")
    _name, tag = _split_ref(ref)
    layout_dir = workdir / "oci"
    bundle = workdir / "bundle"
    for d in (layout_dir, bundle):
        shutil.rmtree(d, ignore_errors=True)
    run_step([umoci, "init", "--layout", str(layout_dir)], log)
    run_step([umoci, "new", "--image", f"{layout_dir}:{tag}"], log)
    run_step([umoci, "unpack", "--image", f"{layout_dir}:{tag}", str(bundle)], log)
    rootfs = bundle / "rootfs"
    shutil.copytree(rootfs_files, rootfs, symlinks=True, dirs_exist_ok=True)
    run_step([umoci, "repack", "--image", f"{layout_dir}:{tag}", str(bundle)], log)
    config = [umoci, "config", "--image", f"{layout_dir}:{tag}"]
    if entrypoint:
        for part in entrypoint:
            config += ["--config.entrypoint", part]
    else:
        config += ["--config.cmd", "/bin/sh"]
    run_step(config, log)
    run_step([umoci, "gc", "--layout", str(layout_dir)], log)
    archive = workdir / "image.tar"
    with tarfile.open(archive, "w") as tar:
        for entry in sorted(layout_dir.iterdir()):
            tar.add(entry, arcname=entry.name)
    shutil.rmtree(bundle, ignore_errors=True)
    return archive


def pause_rootfs(workdir: Path, log: Path) -> Path:
    src = workdir / "pause.c"
    src.write_text(PAUSE_C)
    rootfs = workdir / "files"
    rootfs.mkdir(parents=True, exist_ok=True)
    run_step([tool("gcc"), "-static", "-O2", "-Wall", "-o", str(rootfs / "pause"), str(src)], log)
    return rootfs


def host_usr_rootfs(workdir: Path, etc: Path = Path("/etc")) -> Path:
    rootfs = workdir / "files"
    rootfs.mkdir(parents=True, exist_ok=True)
    for d in ("usr", "etc", "tmp", "dev", "proc", "sys", "root", "run", "var/tmp", "home"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    (rootfs / "var" / "tmp").chmod(0o1777)
    for name in MERGED_USR_LINKS:
        link = rootfs / name
        if not link.is_symlink():
            link.symlink_to(f"usr/{name}")
    for name in HOST_ETC_COPIES:
        src = etc / name
        dst = rootfs / "etc" / name
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
        elif src.is_file():
            shutil.copy2(src, dst)
    return rootfs


def import_image(archive: Path, ref: str, socket: Path, log: Path, timeout_s: float = 180) -> None:
    name, _tag = _split_ref(ref)
    argv = [tool("ctr"), "--address", str(socket), "--namespace", "k8s.io", "images", "import"]
    argv += ["--base-name", name, str(archive)]
    run_step(argv, log, timeout_s=timeout_s)


def import_named(archive: Path, socket: Path, log: Path, timeout_s: float = 600) -> None:
    """A user's archive (`rankpack.devcluster.lifecycle.loadimage`), under the names it
    carries (no ``--base-name``: ``docker save`` names are normalized by containerd)."""
    argv = [tool("ctr"), "--address", str(socket), "--namespace", "k8s.io", "images", "import",
            str(archive)]  # fmt: skip
    run_step(argv, log, timeout_s=timeout_s)


def archives(layout: Layout) -> dict[str, Path]:
    """The image archives every node gets: reference -> OCI archive."""
    try:
        index = json.loads((layout.image_archives / "index.json").read_text())
    except (OSError, ValueError):
        return {}
    return {ref: layout.image_archives / name for ref, name in index.items()}


def register_archive(
    layout: Layout, archive: Path, ref: str, *, keep_in_place: bool = False
) -> Path:
    """Record `archive` as the image `ref` every node imports, now and at `start-node`;
    returns where it is kept. Moved below the state directory, unless `keep_in_place` (an
    archive of the image cache, ``up --operator``'s: recorded by its absolute path)."""
    layout.image_archives.mkdir(parents=True, exist_ok=True)
    index = {r: str(p) for r, p in archives(layout).items()}
    if keep_in_place:
        kept = archive.resolve()
    else:
        kept = layout.image_archives / (ref.replace("/", "_").replace(":", "_") + ".tar")
        if archive.resolve() != kept.resolve():
            shutil.move(str(archive), kept)
    index[ref] = str(kept)
    tmp = layout.image_archives / "index.json.tmp"
    tmp.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    tmp.replace(layout.image_archives / "index.json")
    return kept


def add_to_every_node(
    layout: Layout, archive: Path, ref: str, timeout_s: float = IMPORT_TIMEOUT_S
) -> None:
    """An image built elsewhere (``up --operator``'s, in the image cache, left there):
    recorded for `start-node` and imported into every running node's containerd now."""
    kept = register_archive(layout, archive, ref, keep_in_place=True)
    log = layout.logs / "images.log"
    for spec in layout.recorded_nodes():
        node = layout.node(spec)
        if not node.stopped_marker.exists():
            import_image(kept, ref, node.containerd_socket, log, timeout_s=timeout_s)


def import_all(layout: Layout, node: NodeLayout) -> None:
    """Import every registered archive into `node`'s containerd, then every archive a user
    loaded (`dev-cluster load-image`), under its own names."""
    log = layout.logs / "images.log"
    for ref, archive in archives(layout).items():
        import_image(archive, ref, node.containerd_socket, log, timeout_s=IMPORT_TIMEOUT_S)
    for kept in map(Path, loaded_archives(layout)):
        if kept.is_file():
            import_named(kept, node.containerd_socket, log)


LOADED = "loaded.json"
"""Below `Layout.image_archives`: the archives `dev-cluster load-image` kept, each with the
names it carries (imported under those names, never renamed)."""


def loaded_archives(layout: Layout) -> dict[str, list[str]]:
    """The archives loaded so far: path -> the names each carries."""
    try:
        doc = json.loads((layout.image_archives / LOADED).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {str(k): [str(r) for r in v] for k, v in doc.items() if isinstance(v, list)}


def record_loaded(layout: Layout, archive: Path, refs: tuple[str, ...]) -> None:
    index = {**loaded_archives(layout), str(archive): list(refs)}
    tmp = layout.image_archives / (LOADED + ".tmp")
    tmp.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    tmp.replace(layout.image_archives / LOADED)


def build(layout: Layout) -> None:
    """Build the pause and host-usr images and register their archives."""
    log = layout.logs / "images.log"
    for ref, make, entrypoint in (
        (PAUSE_IMAGE, "pause", ["/pause"]),
        (HOST_USR_IMAGE, "host-usr", None),
    ):
        workdir = layout.images / make
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        files = pause_rootfs(workdir, log) if make == "pause" else host_usr_rootfs(workdir)
        archive = build_image(ref, files, workdir, log, entrypoint)
        register_archive(layout, archive, ref)
        shutil.rmtree(workdir, ignore_errors=True)
