"""Refined copies of a case: blockMesh cell counts multiplied in x and y."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankpack.case.refine import check_refinable, refine_case, refined_blocks
from rankpack.errors import UserError

PITZ_BLOCKS = [
    "hex", [0, 3, 4, 1, 11, 14, 15, 12], [18, 30, 1], "simpleGrading", [0.5, "$posY", 1],
    "hex", [2, 5, 6, 3, 13, 16, 17, 14], [180, 27, 1], "edgeGrading",
    [4, 4, 4, 4, "$negY", 1, 1, "$negY", 1, 1, 1, 1],
]  # fmt: skip


def test_x_and_y_counts_are_multiplied_z_and_the_rest_kept() -> None:
    out = refined_blocks(PITZ_BLOCKS, 2)
    assert out[2] == [36, 60, 1] and out[7] == [360, 54, 1]
    assert out[1] == PITZ_BLOCKS[1] and out[3:5] == PITZ_BLOCKS[3:5] and out[8:] == PITZ_BLOCKS[8:]
    cells = sum(c[0] * c[1] * c[2] for c in (out[2], out[7]))
    assert cells == 4 * (18 * 30 + 180 * 27)


@pytest.mark.parametrize(
    "blocks", [["hex", [0, 1], ["$n", 30, 1]], ["hex", [0, 1], [1, 2]], ["simpleGrading", [1]]]
)
def test_blocks_that_cannot_be_refined_are_refused(blocks: list[object]) -> None:
    with pytest.raises(UserError, match="--refine 1"):
        refined_blocks(blocks, 2)


def test_a_case_file_is_edited_and_a_source_only_checked(tmp_path: Path) -> None:
    case = tmp_path / "c"
    (case / "system").mkdir(parents=True)
    (case / "system" / "blockMeshDict").write_text(
        "FoamFile { version 2.0; format ascii; class dictionary; object blockMeshDict; }\n"
        "blocks ( hex (0 1 2 3 4 5 6 7) (10 20 1) simpleGrading (1 1 1) );\n"
    )
    before = (case / "system" / "blockMeshDict").read_text()
    check_refinable(case, 3)
    assert (case / "system" / "blockMeshDict").read_text() == before
    refine_case(case, 3)
    assert "(30 60 1)" in (case / "system" / "blockMeshDict").read_text()
    with pytest.raises(UserError, match="between 1 and 8"):
        check_refinable(case, 9)
    with pytest.raises(UserError, match="no system/blockMeshDict"):
        check_refinable(tmp_path, 2)
    check_refinable(tmp_path, 1)  # nothing to refine, nothing to check
