"""polyMesh reading (ASCII, binary, gzipped), cell centres and the cell graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rankpack.case.mesh import (
    cell_centres,
    cell_graph,
    graph_from_faces,
    plane_axes,
    read_polymesh,
    wall_bounds,
)
from rankpack.errors import UserError

from .meshgen import grid_mesh, write_case


@pytest.mark.parametrize("binary", [False, True], ids=["ascii", "binary"])
@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gz"])
def test_read_round_trip(tmp_path: Path, binary: bool, compress: bool) -> None:
    mesh = grid_mesh(5, 3)
    write_case(tmp_path, mesh, binary=binary, compress=compress)
    read = read_polymesh(tmp_path)
    assert read.n_cells == 15
    np.testing.assert_array_equal(read.owner, mesh.owner)
    np.testing.assert_array_equal(read.neighbour, mesh.neighbour)
    np.testing.assert_array_equal(read.face_offsets, mesh.face_offsets)
    np.testing.assert_array_equal(read.face_points, mesh.face_points)
    np.testing.assert_allclose(read.points, mesh.points)
    assert [(p.name, p.type) for p in read.patches] == [
        ("walls", "wall"),
        ("frontAndBack", "empty"),
    ]


def test_cell_centres_of_a_grid_are_exact() -> None:
    mesh = grid_mesh(4, 3, dx=0.5, dy=2.0, dz=0.1)
    centres = cell_centres(mesh)
    i, j = np.meshgrid(np.arange(4), np.arange(3))
    expected = np.stack(
        [(i.ravel() + 0.5) * 0.5, (j.ravel() + 0.5) * 2.0, np.full(12, 0.05)], axis=1
    )
    np.testing.assert_allclose(centres, expected, atol=1e-12)


def test_centroid_of_a_skewed_cell_is_volume_weighted() -> None:
    # Move one corner line of a single cell: the centroid is not the point average.
    mesh = grid_mesh(1, 1)
    pts = mesh.points.copy()
    pts[[3, 7], 0] = 3.0  # (1,1,k) -> (3,1,k): a trapezoid with sides 1 and 3 (x), height 1
    skewed = type(mesh)(**{**mesh.__dict__, "points": pts})
    c = cell_centres(skewed)[0]
    # Trapezoid x-centroid: (a² + ab + b²) / (3 (a + b)) with a=1 (bottom), b=3 (top).
    assert c[0] == pytest.approx((1 + 3 + 9) / (3 * 4))
    assert c[1] == pytest.approx((1 + 2 * 3) / (3 * (1 + 3)))


def test_wall_bounds_and_plane() -> None:
    mesh = grid_mesh(4, 2, dx=1.0, dy=1.0, dz=0.1)
    lo, hi = wall_bounds(mesh)  # type: ignore[misc]
    np.testing.assert_allclose(lo, [0, 0, 0])
    np.testing.assert_allclose(hi, [4, 2, 0.1])
    assert plane_axes(mesh.points) == (0, 1)


def test_cell_graph_each_pair_once_per_direction() -> None:
    mesh = grid_mesh(3, 2)
    g = cell_graph(mesh)
    assert g.n_cells == 6
    assert len(g.adjncy) == 2 * mesh.n_internal_faces
    assert g.eweights is None
    neighbours_of_0 = set(g.adjncy[g.xadj[0] : g.xadj[1]].tolist())
    assert neighbours_of_0 == {1, 3}


def test_duplicate_faces_become_edge_weights() -> None:
    g = graph_from_faces(np.array([0, 0, 1]), np.array([1, 1, 2]), 3)
    assert g.eweights is not None
    assert g.eweights[g.xadj[0] : g.xadj[1]].tolist() == [2]


def test_missing_file_is_one_line_error(tmp_path: Path) -> None:
    write_case(tmp_path, grid_mesh(2, 2))
    (tmp_path / "constant" / "polyMesh" / "faces").unlink()
    with pytest.raises(UserError, match=r"incomplete: faces missing"):
        read_polymesh(tmp_path)


def test_no_mesh_directory(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no mesh"):
        read_polymesh(tmp_path)


def test_truncated_owner_is_reported(tmp_path: Path) -> None:
    mesh = grid_mesh(3, 3)
    short = type(mesh)(**{**mesh.__dict__, "owner": mesh.owner[:-2]})
    write_case(tmp_path, short)
    with pytest.raises(UserError, match="inconsistent"):
        read_polymesh(tmp_path)


def test_garbage_file_is_reported(tmp_path: Path) -> None:
    write_case(tmp_path, grid_mesh(2, 2))
    (tmp_path / "constant" / "polyMesh" / "owner").write_text("FoamFile { format ascii; }\n3 ( 0 x")
    with pytest.raises(UserError):
        read_polymesh(tmp_path)


def test_fast_ascii_faces_matches_foamlib_on_mixed_faces(tmp_path: Path) -> None:
    from foamlib import FoamFile

    from rankpack.case.mesh import _faces_csr, _fast_ascii_faces

    path = tmp_path / "faces"
    path.write_text(
        "FoamFile\n{\n    format ascii;\n    class faceList;\n    object faces;\n}\n"
        "// comment\n\n4\n(\n3(0 1 2)\n4(2 3 4 5)\n5(5 6 7 8 9)\n3(9 10 0)\n)\n"
    )
    fast = _fast_ascii_faces(path)
    assert fast is not None
    offsets, verts = _faces_csr(FoamFile(path)[None], path)
    np.testing.assert_array_equal(fast[0], offsets)
    np.testing.assert_array_equal(fast[1], verts)
    assert fast[0].tolist() == [0, 3, 7, 12, 15]


def test_fast_reader_declines_what_it_does_not_know(tmp_path: Path) -> None:
    from rankpack.case.mesh import _fast_ascii_faces

    path = tmp_path / "faces"
    path.write_text(  # the declared length does not match: leave it to foamlib
        "FoamFile\n{\n    format ascii;\n    class faceList;\n}\n3\n(\n3(0 1 2)\n)\n"
    )
    assert _fast_ascii_faces(path) is None
