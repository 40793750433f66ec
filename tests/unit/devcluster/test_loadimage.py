"""`dev-cluster load-image`'s reading of a user's archive (`lifecycle.loadimage`): the
names it carries, from its manifest.json (docker save) or index.json (OCI), bounded; what
names none, or names something that is no image reference, is a one-line refusal."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from rankpack.devcluster.lifecycle import loadimage
from rankpack.errors import UserError


def _tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _oci(names: list[dict[str, str]]) -> bytes:
    manifests = [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                  "digest": "sha256:" + "0" * 64, "size": 1, "annotations": n}
                 for n in names]  # fmt: skip
    return json.dumps({"schemaVersion": 2, "manifests": manifests}).encode()


def test_a_docker_save_archive_names_its_repo_tags(tmp_path: Path) -> None:
    manifest = [{"Config": "c.json", "RepoTags": ["team.example/cfd/foam:12", "foam:latest"],
                 "Layers": []}]  # fmt: skip
    archive = _tar(tmp_path / "a.tar", {"blob": b"x" * 10, "manifest.json":
                                        json.dumps(manifest).encode()})  # fmt: skip
    assert loadimage.archive_refs(archive) == ("team.example/cfd/foam:12", "foam:latest")


def test_an_oci_archive_names_its_annotated_references(tmp_path: Path) -> None:
    names = [{"io.containerd.image.name": "team.example/cfd/foam:12",
              "org.opencontainers.image.ref.name": "12"},
             {"org.opencontainers.image.ref.name": "docker.io/library/mpich:4"},
             {"org.opencontainers.image.ref.name": "latest"}]  # fmt: skip
    archive = _tar(tmp_path / "o.tar", {"oci-layout": b"{}", "./index.json": _oci(names)})
    assert loadimage.archive_refs(archive) == ("team.example/cfd/foam:12",
                                               "docker.io/library/mpich:4")  # fmt: skip


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ({"blob": b"x"}, "no manifest.json or index.json"),
        ({"manifest.json": b"[{"}, "not JSON"),
        ({"manifest.json": json.dumps([{"RepoTags": []}]).encode()}, "names no image"),
        ({"index.json": _oci([{"org.opencontainers.image.ref.name": "v1"}])}, "names no image"),
        ({"manifest.json": json.dumps([{"RepoTags": ["Team/CFD:1"]}]).encode()},
         "not an image reference"),
        ({"manifest.json": json.dumps([{"RepoTags": ["x:1; rm -rf /"]}]).encode()},
         "not an image reference"),
        ({"manifest.json": b"[" + b" " * (loadimage.MAX_INDEX + 1) + b"]"}, "more than an index"),
    ],
)  # fmt: skip
def test_what_names_no_image_is_refused_in_one_line(
    tmp_path: Path, files: dict[str, bytes], said: str
) -> None:
    with pytest.raises(UserError) as refused:
        loadimage.archive_refs(_tar(tmp_path / "bad.tar", files))
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_a_file_that_is_no_tar_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\x00\x01not a tar" * 100)
    with pytest.raises(UserError, match="not a readable image archive"):
        loadimage.archive_refs(junk)


def test_only_the_first_entries_are_looked_at(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(loadimage, "MAX_MEMBERS", 3)
    files = {f"blob{i}": b"x" for i in range(5)}
    files["manifest.json"] = json.dumps([{"RepoTags": ["a/b:1"]}]).encode()
    with pytest.raises(UserError, match=r"no manifest\.json or index\.json"):
        loadimage.archive_refs(_tar(tmp_path / "long.tar", files))
