"""`rankpack dev-cluster load-image ARCHIVE`: a user's image archive into every node.

The dev cluster has no registry (its nodes reach nothing off this machine), so an image a
Simulation names in ``spec.image`` gets there the way ``kind load image-archive`` does it:
the archive (``docker save``, ``podman save``, ``ctr images export`` or an OCI layout in a
tar) is imported into each running node's containerd under the names it carries, and kept
below the cluster's state so that a node `start-node` brings back gets it too. Pods use it
with ``imagePullPolicy: IfNotPresent`` (or ``Never``).

The archive is the user's: its names are read from its ``manifest.json`` (Docker) or
``index.json`` (OCI) only, bounded (at most `MAX_MEMBERS` entries looked at, `MAX_INDEX`
bytes read), and each must be an image reference (`rankpack.plan.submission.IMAGE_PATTERN`);
an archive that names no image is refused before anything is copied or imported.
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankpack.devcluster import images
from rankpack.devcluster.layout import CONTROL_PLANE, Layout
from rankpack.devcluster.lifecycle.clusterstate import running_components
from rankpack.devcluster.lifecycle.preflight import locked, require_root
from rankpack.errors import UserError
from rankpack.plan.submission import IMAGE_PATTERN, MAX_IMAGE

MAX_MEMBERS = 10_000
"""Entries of the archive looked at for its index (an image's layers are a few dozen)."""
MAX_INDEX = 1 << 20
"""Bytes of its ``manifest.json`` or ``index.json`` read."""
NAME_KEYS = ("io.containerd.image.name", "org.opencontainers.image.ref.name")


@dataclass(frozen=True)
class Loaded:
    refs: tuple[str, ...]
    nodes: tuple[str, ...]
    seconds: float


def archive_refs(archive: Path) -> tuple[str, ...]:
    """The image references ``archive`` carries; UserError (one line) if it is no image
    archive or names none."""
    fix = "write it with `docker save IMAGE -o FILE`, `podman save` or `ctr images export`"
    try:
        with tarfile.open(archive, "r:*") as tar:
            found = _index(tar)
    except (OSError, tarfile.TarError) as exc:
        raise UserError(f"{archive} is not a readable image archive ({exc}); {fix}") from None
    if found is None:
        raise UserError(f"{archive} has no manifest.json or index.json at its top: it is not "
                        f"an image archive; {fix}")  # fmt: skip
    name, data = found
    try:
        doc = json.loads(data)
    except ValueError:
        raise UserError(f"{archive}: its {name} is not JSON; {fix}") from None
    refs = _refs(doc) if name == "manifest.json" else _oci_refs(doc)
    bad = [r for r in refs if len(r) > MAX_IMAGE or not _is_ref(r)]
    if bad:
        raise UserError(f"{archive} names {bad[0][:120]!r}, which is not an image reference")
    if not refs:
        raise UserError(f"{archive} names no image (an archive saved by digest or without "
                        f"a tag); {fix} with a name such as team.example/cfd/foam:12")  # fmt: skip
    return tuple(dict.fromkeys(refs))


def _index(tar: tarfile.TarFile) -> tuple[str, bytes] | None:
    for i, member in enumerate(tar):
        if i >= MAX_MEMBERS:
            return None
        name = member.name.removeprefix("./")
        if name in ("manifest.json", "index.json") and member.isfile():
            if member.size > MAX_INDEX:
                raise UserError(f"its {name} is {member.size} bytes, more than an index has")
            f = tar.extractfile(member)
            if f is not None:
                return name, f.read(MAX_INDEX)
    return None


def _refs(doc: Any) -> list[str]:
    """A ``docker save`` manifest: a list of images, each with its ``RepoTags``."""
    if not isinstance(doc, list):
        return []
    return [str(t) for m in doc if isinstance(m, dict) for t in m.get("RepoTags") or ()]


def _oci_refs(doc: Any) -> list[str]:
    """An OCI index: each manifest's name annotation, when it is a whole reference (an
    ``org.opencontainers.image.ref.name`` may be a tag alone)."""
    out = []
    manifests = doc.get("manifests") if isinstance(doc, dict) else None
    for m in manifests if isinstance(manifests, list) else ():
        notes = m.get("annotations") if isinstance(m, dict) else None
        for key in NAME_KEYS:
            value = str((notes or {}).get(key) or "") if isinstance(notes, dict) else ""
            if "/" in value or ":" in value.rpartition("/")[2]:
                out.append(value)
                break
    return out


def _is_ref(ref: str) -> bool:
    return re.fullmatch(IMAGE_PATTERN, ref) is not None


def load(state_dir: Path, archive: Path) -> Loaded:
    """Import ``archive`` into every running node and keep it for `start-node`."""
    require_root()
    started = time.monotonic()
    refs = archive_refs(archive)
    layout = Layout(state_dir)
    with locked(layout):
        if not all(c in running_components(layout) for c in CONTROL_PLANE):
            raise UserError("the dev cluster is not up; `rankpack dev-cluster up` first")
        layout.image_archives.mkdir(parents=True, exist_ok=True)
        kept = layout.image_archives / ("loaded-" + _file_name(refs[0]) + ".tar")
        tmp = kept.with_suffix(".tar.tmp")
        shutil.copyfile(archive, tmp)  # (the user's file stays where it is)
        tmp.replace(kept)
        images.record_loaded(layout, kept, refs)
        log = layout.logs / "images.log"
        nodes = []
        for spec in layout.recorded_nodes():
            node = layout.node(spec)
            if not node.stopped_marker.exists():
                images.import_named(kept, node.containerd_socket, log)
                nodes.append(spec.name)
    return Loaded(refs, tuple(nodes), time.monotonic() - started)


def _file_name(ref: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in ref)[:120]
