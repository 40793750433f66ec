"""Tiny structured polyMesh cases written by hand (ASCII or binary, optionally gzipped)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from rankpack.case.mesh import Patch, PolyMesh


def grid_mesh(nx: int, ny: int, dx: float = 1.0, dy: float = 1.0, dz: float = 0.1) -> PolyMesh:
    """nx × ny × 1 hex cells; patch 'walls' (wall) around, 'frontAndBack' (empty)."""

    def pid(i: int, j: int, k: int) -> int:
        return (k * (ny + 1) + j) * (nx + 1) + i

    def cid(i: int, j: int) -> int:
        return j * nx + i

    pts = np.array(
        [(i * dx, j * dy, k * dz) for k in range(2) for j in range(ny + 1) for i in range(nx + 1)],
        dtype=np.float64,
    )
    faces: list[list[int]] = []
    owner: list[int] = []
    neighbour: list[int] = []
    # Internal faces in upper-triangular order (by owner, then neighbour).
    for j in range(ny):
        for i in range(nx):
            if i + 1 < nx:
                faces.append(
                    [pid(i + 1, j, 0), pid(i + 1, j + 1, 0), pid(i + 1, j + 1, 1), pid(i + 1, j, 1)]
                )
                owner.append(cid(i, j))
                neighbour.append(cid(i + 1, j))
            if j + 1 < ny:
                faces.append(
                    [pid(i, j + 1, 0), pid(i, j + 1, 1), pid(i + 1, j + 1, 1), pid(i + 1, j + 1, 0)]
                )
                owner.append(cid(i, j))
                neighbour.append(cid(i, j + 1))
    n_internal = len(faces)
    for j in range(ny):
        faces.append([pid(0, j, 0), pid(0, j, 1), pid(0, j + 1, 1), pid(0, j + 1, 0)])
        owner.append(cid(0, j))
        faces.append([pid(nx, j, 0), pid(nx, j + 1, 0), pid(nx, j + 1, 1), pid(nx, j, 1)])
        owner.append(cid(nx - 1, j))
    for i in range(nx):
        faces.append([pid(i, 0, 0), pid(i + 1, 0, 0), pid(i + 1, 0, 1), pid(i, 0, 1)])
        owner.append(cid(i, 0))
        faces.append([pid(i, ny, 0), pid(i, ny, 1), pid(i + 1, ny, 1), pid(i + 1, ny, 0)])
        owner.append(cid(i, ny - 1))
    n_wall = len(faces) - n_internal
    for j in range(ny):
        for i in range(nx):
            faces.append([pid(i, j, 0), pid(i, j + 1, 0), pid(i + 1, j + 1, 0), pid(i + 1, j, 0)])
            owner.append(cid(i, j))
            faces.append([pid(i, j, 1), pid(i + 1, j, 1), pid(i + 1, j + 1, 1), pid(i, j + 1, 1)])
            owner.append(cid(i, j))
    offsets = np.arange(0, 4 * len(faces) + 1, 4, dtype=np.int64)
    return PolyMesh(
        points=pts,
        face_offsets=offsets,
        face_points=np.asarray(faces, dtype=np.int64).reshape(-1),
        owner=np.asarray(owner, dtype=np.int64),
        neighbour=np.asarray(neighbour, dtype=np.int64),
        n_cells=nx * ny,
        patches=(
            Patch("walls", "wall", n_internal, n_wall),
            Patch("frontAndBack", "empty", n_internal + n_wall, len(faces) - n_internal - n_wall),
        ),
    )


def _header(cls: str, obj: str, fmt: str, note: str = "") -> bytes:
    note_line = f'    note "{note}";\n' if note else ""
    return (
        f"FoamFile\n{{\n    version 2.0;\n    format {fmt};\n    class {cls};\n"
        f'    arch "LSB;label=32;scalar=64";\n{note_line}'
        f'    location "constant/polyMesh";\n    object {obj};\n}}\n\n'
    ).encode()


def _ascii_list(items: list[str]) -> bytes:
    return (f"{len(items)}\n(\n" + "\n".join(items) + "\n)\n").encode()


def _binary_list(arr: np.ndarray) -> bytes:
    n = arr.shape[0]
    return f"{n}\n(".encode() + arr.tobytes() + b")\n"


def write_case(case: Path, mesh: PolyMesh, *, binary: bool = False, compress: bool = False) -> Path:
    """A minimal case: system/controlDict and constant/polyMesh/{points,faces,owner,...}."""
    (case / "system").mkdir(parents=True, exist_ok=True)
    (case / "system" / "controlDict").write_text(
        "FoamFile\n{\n    version 2.0;\n    format ascii;\n    class dictionary;\n"
        "    object controlDict;\n}\napplication simpleFoam;\nstartTime 0;\nendTime 5;\n"
        "deltaT 1;\nwriteFormat ascii;\n"
    )
    poly = case / "constant" / "polyMesh"
    poly.mkdir(parents=True, exist_ok=True)
    fmt = "binary" if binary else "ascii"
    note = (
        f"nPoints:{len(mesh.points)} nCells:{mesh.n_cells} nFaces:{mesh.n_faces} "
        f"nInternalFaces:{mesh.n_internal_faces}"
    )
    files: dict[str, bytes] = {}
    if binary:
        files["points"] = _header("vectorField", "points", fmt) + _binary_list(mesh.points)
        files["faces"] = (
            _header("faceCompactList", "faces", fmt)
            + _binary_list(mesh.face_offsets.astype(np.int32))
            + b"\n"
            + _binary_list(mesh.face_points.astype(np.int32))
        )
        files["owner"] = _header("labelList", "owner", fmt, note) + _binary_list(
            mesh.owner.astype(np.int32)
        )
        files["neighbour"] = _header("labelList", "neighbour", fmt, note) + _binary_list(
            mesh.neighbour.astype(np.int32)
        )
    else:
        files["points"] = _header("vectorField", "points", fmt) + _ascii_list(
            [f"({p[0]!r} {p[1]!r} {p[2]!r})" for p in mesh.points.tolist()]
        )
        offs = mesh.face_offsets
        files["faces"] = _header("faceList", "faces", fmt) + _ascii_list(
            [
                f"{offs[i + 1] - offs[i]}("
                + " ".join(map(str, mesh.face_points[offs[i] : offs[i + 1]].tolist()))
                + ")"
                for i in range(mesh.n_faces)
            ]
        )
        files["owner"] = _header("labelList", "owner", fmt, note) + _ascii_list(
            [str(x) for x in mesh.owner.tolist()]
        )
        files["neighbour"] = _header("labelList", "neighbour", fmt, note) + _ascii_list(
            [str(x) for x in mesh.neighbour.tolist()]
        )
    patches = "".join(
        f"    {p.name}\n    {{\n        type {p.type};\n        nFaces {p.n_faces};\n"
        f"        startFace {p.start_face};\n    }}\n"
        for p in mesh.patches
    )
    files["boundary"] = (
        _header("polyBoundaryMesh", "boundary", "ascii")
        + f"{len(mesh.patches)}\n(\n{patches})\n".encode()
    )
    for name, data in files.items():
        if compress and name != "boundary":
            with gzip.open(poly / f"{name}.gz", "wb") as fh:
                fh.write(data)
        else:
            (poly / name).write_bytes(data)
    return case
