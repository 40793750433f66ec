"""`rankpack report`: recorded runs and multiplex sessions as one self-contained HTML page
(figures embedded), with every figure also written as a PNG beside it."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from rankpack.cli.common import data_dir, db_path, parse_id, parse_report_file, print_json
from rankpack.errors import UserError
from rankpack.report.build import Part, build_report, write_report
from rankpack.store import Store


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "report",
        help="an HTML report (figures embedded, also as PNG) of runs or multiplex sessions",
        description=(
            "Write one self-contained HTML file (no network fetches; figures embedded as PNG) "
            "for the given runs and/or multiplex sessions: per-rank requests over time with "
            "every resize, a duty-cycle heat-map (rank x time), CPU use against requests, "
            "throttling, solver progress and residuals, the controller's events with their "
            "reasons, and for sessions the timeline and the throughput gain against its "
            "physical limit. The figures are also written as PNG files into "
            "<name>_figures/ beside the page."
        ),
    )
    p.add_argument("runs", type=parse_id, nargs="*", metavar="RUN_ID", help="runs to report")
    p.add_argument(
        "--multiplex",
        type=parse_id,
        action="append",
        default=[],
        metavar="ID",
        help="a multiplex session (with each of its runs); repeatable",
    )
    p.add_argument(
        "--output",
        "-o",
        type=parse_report_file,
        help="the HTML file (default: <data dir>/reports/run-N.html or multiplex-N.html)",
    )
    p.add_argument("--json", action="store_true", help="print the written paths as JSON")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if not args.runs and not args.multiplex:
        raise UserError(
            "give a run id or --multiplex ID; see `rankpack runs list` and `rankpack events`"
        )
    path = db_path(args)
    store = Store.open_existing(path)
    if store is None:
        raise UserError(f"no rankpack database at {path}; nothing has been recorded there")
    parts = [Part(multiplex_id=m) for m in args.multiplex] + [Part(run_id=r) for r in args.runs]
    doc = build_report(store, parts)  # every id is checked before anything is written
    output: Path = args.output or default_output(args.runs, args.multiplex)
    output.parent.mkdir(parents=True, exist_ok=True)
    written = write_report(doc, output)
    figures = [f.key for s in doc.sections for f in s.figures]
    tables = [t.key for s in doc.sections for t in s.tables]
    if args.json:
        print_json(
            {
                "html": str(written.html),
                "png_dir": str(written.png_dir),
                "pngs": [str(p) for p in written.pngs],
                "figures": figures,
                "tables": tables,
            }
        )
    else:
        Console().print(
            f"report: {written.html}\n{len(figures)} figures (also as PNG in "
            f"{written.png_dir}/), {len(tables)} tables"
        )
    return 0


def default_output(runs: list[int], sessions: list[int]) -> Path:
    name = "-".join(
        [f"multiplex-{m}" for m in sessions[:3]] + [f"run-{r}" for r in runs[:3]]
    ) + ("-etc" if len(runs) + len(sessions) > 3 else "")  # fmt: skip
    return data_dir() / "reports" / f"{name}.html"
