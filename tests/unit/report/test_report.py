"""The report layer on a real SQLite store: series, the HTML page, atomic writes, the CLI.

The store is filled the way the control loop fills it (runs, per-rank samples with the
shim's counters, resizes, events, a multiplex session); the solver log is a real one
(tests/data). No OpenFOAM here: the browser tests in tests/integration open a report of a
real run.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from rankpack.cli import main
from rankpack.core.results import RankResult, ResizeRecord, RunResult
from rankpack.report import build
from rankpack.report.build import Part, build_report, png_dir_for, write_report
from rankpack.report.data import (
    IterationPace,
    iteration_pace,
    load_run,
    parse_history,
    rank_series,
)
from rankpack.store import NewRun, RankRow, SampleRow, Store

LOG = Path(__file__).parents[2] / "data" / "log.simpleFoam.pitzDaily.cut"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _report_run(store: Store, run_dir: Path, *, multiplex_id: int | None = None) -> int:
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(LOG, run_dir / "log.simpleFoam")
    options: dict[str, object] = {"iterations": 5, "wait_mode": "auto", "shim": True}
    if multiplex_id is not None:
        options["multiplex_id"] = multiplex_id
    run_id = store.create_run(
        NewRun(
            case_name="pitzDaily", case_source="/src", run_dir=str(run_dir),
            solver="simpleFoam", n_ranks=2, qos="requests", total_millis=1000,
            decompose="weighted", backend="local", placement={}, expected_iterations=5,
            options=options,
        ),
        [RankRow(0, 1.0, 500, None, 100), RankRow(1, 1.0, 500, None, 300)],
    )  # fmt: skip
    samples = []
    for k in range(6):  # 6 ticks, 1 s apart: rank 0 computes 25 % of the time, rank 1 75 %
        t = 1.0 + k
        request = 500 if k < 3 else (250, 750)
        for rank, duty in ((0, 0.25), (1, 0.75)):
            millis = request if isinstance(request, int) else request[rank]
            samples.append(
                SampleRow(
                    t,
                    rank,
                    int(k * 1e9),
                    millis,
                    2 * k * rank,
                    k,
                    int(k * duty * 1e9),
                    int(k * (1 - duty) * 1e9),
                )
            )
    store.add_samples(run_id, samples)
    for rank, to in ((0, 250), (1, 750)):
        store.add_resize(run_id, ResizeRecord(rank, 3.2, 500, to, "completed", 0.01,
                                              "duty 25 %", "size"))  # fmt: skip
    store.add_event(run_id, "resize", {"rank": 0, "reason": "duty <script>alert(1)</script>"},
                    multiplex_id=multiplex_id, t_s=3.2)  # fmt: skip
    store.add_event(run_id, "launch", {"queue_id": 1}, multiplex_id=multiplex_id, t_s=0.5)
    store.add_event(run_id, "finished", {"status": "completed"}, multiplex_id=multiplex_id,
                    t_s=7.0)  # fmt: skip
    store.finish_run(
        RunResult(
            id=run_id, status="completed", case="pitzDaily", solver="simpleFoam",
            run_dir=str(run_dir), n_ranks=2, qos="requests", total_millis=1000, iterations=5,
            expected_iterations=5, wall_s=6.5, cpu_s=10.0, exit_code=0, message=None,
            ranks=(
                RankResult(0, 1.0, 250, None, 5.0, 5.0, 0, 0.0, cells=100, duty=0.25),
                RankResult(1, 1.0, 750, None, 5.0, 5.0, 10, 0.2, cells=300, duty=0.75),
            ),
            decompose="weighted", backend="local",
        )
    )  # fmt: skip
    return run_id


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "db" / "r.db")


def _multiplex_session(store: Store, tmp_path: Path) -> tuple[int, list[int]]:
    mid = store.start_multiplex(2000, 4, "auto")
    runs = [_report_run(store, tmp_path / f"runs/m{i}", multiplex_id=mid) for i in range(2)]
    store.add_event(None, "launch-held", {"reason": "cooldown"}, multiplex_id=mid, t_s=1.0)
    store.finish_multiplex(mid, "completed", {
        "makespan_s": 8.0, "sequential_s": 13.0, "throughput_gain": 13 / 8,
        "throughput_limit": 1.8, "baseline": "db", "fairness_ratio": 1.1, "resizes": 4,
        "restarts": 0, "max_concurrent_seen": 2,
        "simulations": [{"id": r, "case": "pitzDaily", "status": "completed", "iterations": 5,
                         "expected_iterations": 5, "wall_s": 6.5, "started_s": 0.5 + i,
                         "finished_s": 7.0 + i} for i, r in enumerate(runs)],
    })  # fmt: skip
    return mid, runs


# -- series ---------------------------------------------------------------------------------


def test_duty_cpu_and_throttling_series_from_the_stored_samples(
    store: Store, tmp_path: Path
) -> None:
    run_id = _report_run(store, tmp_path / "runs" / "a")
    data = load_run(store, run_id)
    r0, r1 = data.ranks
    assert r0.duty()[1] == pytest.approx([0.25] * 5)
    assert r1.duty()[1] == pytest.approx([0.75] * 5)
    times, duty = data.duty_matrix()
    assert len(times) == 5 and [len(row) for row in duty] == [5, 5]
    mid, cores = r0.cpu_cores()
    assert cores == pytest.approx([1.0] * 5) and len(mid) == 5
    assert r1.throttled_per_s()[1] == pytest.approx([2.0] * 5)
    assert data.has_duty and data.throttled_total == 10
    assert [p[1] for p in data.progress] == [0, 1, 2, 3, 4, 5]


def test_duty_is_unknown_without_the_shim_counters() -> None:
    rows = [SampleRow(float(t), 0, t * 10**9, 500, 0, t) for t in range(4)]
    (series,) = rank_series(rows, 1)
    assert series.duty()[1] == [None, None, None]


def test_iteration_pace_leaves_start_up_out_and_bounds_a_stalled_run() -> None:
    # start-up: 4 s to the first iteration, then 0.5 s per iteration
    points = [(1.0, 0), (4.0, 1), (5.0, 3), (6.0, 5)]
    assert iteration_pace(points).seconds_per_iteration == pytest.approx(0.5)
    stalled = iteration_pace([(1.0, 0), (4.0, 1), (9.0, 1)], end_s=10.0)
    assert stalled == IterationPace(6.0, 1, 4.0, lower_bound=True)
    assert iteration_pace([(1.0, 0)], end_s=15.0).lower_bound
    assert iteration_pace([]).seconds_per_iteration is None


def test_residual_history_from_a_real_solver_log() -> None:
    history = parse_history(LOG.read_text())
    assert {"Ux", "Uy", "p", "k", "epsilon"} <= set(history.residuals)
    iterations = [i for i, _ in history.residuals["p"]]
    assert iterations == list(range(1, len(iterations) + 1)) and len(iterations) == 5
    assert all(0 < v <= 1 for _, v in history.residuals["p"])
    assert [i for i, _ in history.clock_s] == iterations


# -- the page ---------------------------------------------------------------------------------


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.figures: list[str] = []
        self.tables: list[str] = []
        self.srcs: list[str] = []
        self.links: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.add(tag)
        if tag == "figure" and a.get("data-figure"):
            self.figures.append(str(a["data-figure"]))
        if tag == "table" and a.get("data-table"):
            self.tables.append(str(a["data-table"]))
        if "src" in a:
            self.srcs.append(str(a["src"]))
        if "href" in a:
            self.links.append(str(a["href"]))


def test_report_of_a_session_is_one_self_contained_page(store: Store, tmp_path: Path) -> None:
    mid, runs = _multiplex_session(store, tmp_path)
    doc = build_report(store, [Part(multiplex_id=mid)], headline="H", summary=["why"])
    (tmp_path / "out").mkdir()
    written = write_report(doc, tmp_path / "out" / "r.html")
    text = written.html.read_text()
    page = _Page()
    page.feed(text)
    per_run = ["requests", "cpu", "duty", "throttling", "progress"]
    expected = [f"session{mid}-timeline", f"session{mid}-gain"] + [
        f"run{r}-{k}" for r in runs for k in per_run
    ]
    assert page.figures == expected
    assert page.tables == [f"session{mid}-simulations", f"session{mid}-events"] + [
        f"run{r}-{k}" for r in runs for k in ("ranks", "resizes", "events")
    ]
    # no network: every image is an embedded PNG, every link an anchor in the page
    assert len(page.srcs) == len(expected)
    for src in page.srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_MAGIC
    assert page.links and all(h.startswith("#") for h in page.links)
    assert not {"script", "link", "iframe", "object"} & page.tags
    assert "http://" not in text and "https://" not in text
    assert "<script>alert(1)" not in text and "&lt;script&gt;alert(1)" in text
    # the PNGs beside it are the same figures
    assert sorted(p.name for p in written.pngs) == sorted(f"{k}.png" for k in expected)
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in written.pngs)
    assert written.png_dir == png_dir_for(written.html) == tmp_path / "out" / "r_figures"
    assert "1.62x" in text and "1.80x" in text  # gain and limit tiles


def test_a_failed_write_leaves_the_previous_report_untouched(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = _report_run(store, tmp_path / "runs" / "a")
    out = tmp_path / "out" / "r.html"
    out.parent.mkdir()
    first = write_report(build_report(store, [Part(run_id=run_id)]), out)
    before = {p: p.read_bytes() for p in [out, *first.pngs]}

    def broken(doc: object) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(build, "render", broken)
    with pytest.raises(build.UserError, match="No space left"):
        write_report(build_report(store, [Part(run_id=run_id)]), out)
    assert {p: p.read_bytes() for p in [out, *first.pngs]} == before
    assert sorted(os.listdir(out.parent)) == ["r.html", "r_figures"]  # no temporary left


# -- the command ------------------------------------------------------------------------------


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["report", "99"], "no run with id 99"),
        (["report", "--multiplex", "7"], "no multiplex session with id 7"),
        (["report"], "give a run id"),
        (["report", "1", "-o", "@T/x.txt"], "not an .html file"),
        (["report", "1", "-o", "@T/nodir/x.html"], "does not exist"),
        (["report", "1", "-o", "/proc/x.html"], "kernel filesystem"),
        (["report", "1", "-o", "@T/blocked.html"], "is a file"),
        (["report", "0"], "report"),
    ],
)
def test_bad_report_requests_are_one_line_and_write_nothing(
    argv: list[str], says: str, store: Store, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    _report_run(store, tmp_path / "runs" / "a")
    monkeypatch.setenv("RANKPACK_DB", str(store.path))
    (tmp_path / "blocked_figures").write_text("a file where the figures would go")
    before = _tree(tmp_path)
    code = main([a.replace("@T", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and says in err, err
    assert _tree(tmp_path) == before


def test_report_without_a_database_creates_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANKPACK_DB", str(tmp_path / "none" / "r.db"))
    assert main(["report", "1"]) == 2
    assert "no rankpack database" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_report_command_writes_the_page_and_the_pngs(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    mid, runs = _multiplex_session(store, tmp_path)
    monkeypatch.setenv("RANKPACK_DB", str(store.path))
    out = tmp_path / "rep.html"
    assert main(["report", "--multiplex", str(mid), "-o", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["html"] == str(out) and out.is_file()
    assert len(data["figures"]) == 2 + 5 * len(runs) == len(data["pngs"])
    assert all(Path(p).is_file() for p in data["pngs"])
    # again, by run id, to the default place under the data directory
    assert main(["report", str(runs[0])]) == 0
    default = Path(os.environ["RANKPACK_HOME"]) / "reports" / f"run-{runs[0]}.html"
    assert default.is_file() and "report:" in capsys.readouterr().out


def test_a_run_without_samples_or_log_still_has_every_figure(store: Store, tmp_path: Path) -> None:
    run_id = store.create_run(
        NewRun(
            case_name="x", case_source="/src", run_dir=str(tmp_path / "gone"), solver="simpleFoam",
            n_ranks=1, qos="limits", total_millis=100, decompose="equal", backend="local",
            placement={}, expected_iterations=None, options={},
        ),
        [RankRow(0, 1.0, 100, 100, 10)],
    )  # fmt: skip
    doc = build_report(store, [Part(run_id=run_id)])
    keys = [f.key for s in doc.sections for f in s.figures]
    assert keys == [f"run{run_id}-{k}" for k in
                    ("requests", "cpu", "duty", "throttling", "progress")]  # fmt: skip
    assert all(f.png[:8] == PNG_MAGIC for s in doc.sections for f in s.figures)
