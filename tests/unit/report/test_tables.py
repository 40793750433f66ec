"""The run table a user reads at the end of `rankpack run` and in `rankpack runs show`."""

from __future__ import annotations

from rich.console import Console

from rankpack.core.results import RankResult, RunResult
from rankpack.report.tables import run_table


def _table_result(backend: str, nodes: tuple[str | None, str | None]) -> RunResult:
    return RunResult(
        id=3, status="completed", case="pitzDaily", solver="simpleFoam", run_dir="/tmp/r",
        n_ranks=2, qos="requests", total_millis=1000, iterations=5, expected_iterations=5,
        wall_s=6.5, cpu_s=10.0, exit_code=0, message=None,
        ranks=tuple(
            RankResult(i, 1.0, 500, None, 5.0, 5.0, 0, 0.0, cells=100, duty=0.5, node=node)
            for i, node in enumerate(nodes)
        ),
        backend=backend,
    )  # fmt: skip


def _text(result: RunResult) -> str:
    console = Console(width=200, record=True)
    console.print(run_table(result))
    return console.export_text()


def test_a_cluster_run_names_each_ranks_node() -> None:
    text = _text(_table_result("kubernetes", ("rankpack-node", "rankpack-node-1")))
    header = next(line for line in text.splitlines() if "rank" in line and "duty" in line)
    assert "node" in header
    rows = [line for line in text.splitlines() if "rankpack-node" in line]
    assert len(rows) == 2 and "rankpack-node-1" in rows[1] and "rankpack-node-1" not in rows[0]


def test_a_local_run_has_no_node_column() -> None:
    result = _table_result("local", ("myhost", "myhost"))
    text = _text(result)
    assert "myhost" not in text
    # nor a cluster run whose ranks were never placed (no node known)
    unplaced = _table_result("kubernetes", (None, None))
    header = next(line for line in _text(unplaced).splitlines() if "duty" in line)
    assert "node" not in header
