"""`rankpack report`: runs and multiplex sessions from the store as one self-contained HTML
page, with every figure also written as a PNG file.

`build_report` reads the store (and each run's solver log) into a `ReportDoc`;
`write_report` writes the page and a directory of PNGs beside it atomically: everything is
written under temporary names in the target directory and renamed into place only when all
of it is written, so a failure leaves the previous files (or nothing) behind. Called by
`rankpack report` and `rankpack demo`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rankpack.errors import UserError
from rankpack.report.data import (
    RunData,
    SessionData,
    event_text,
    iteration_pace,
    load_run,
    load_session,
    rank_work,
)
from rankpack.report.figures import Figure, run_figures, session_figures
from rankpack.report.gain import gain_lines
from rankpack.report.html import ReportDoc, Section, Table, Tile, render
from rankpack.store import EventRow, Store

MAX_EVENTS_SHOWN = 400
"""A table longer than this keeps its first and last events (the count says how many)."""


def _f(value: float | None, fmt: str = ".1f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def _events_table(key: str, title: str, events: Sequence[EventRow]) -> Table:
    shown = list(events)
    note = ""
    if len(shown) > MAX_EVENTS_SHOWN:
        half = MAX_EVENTS_SHOWN // 2
        note = f"{len(shown)} events; the first and last {half} are shown"
        shown = shown[:half] + shown[-half:]
    rows = []
    for e in shown:
        reason, rest = event_text(e)
        rows.append((f"{e.t_s:.1f}", str(e.run_id or "-"), e.kind, reason, rest))
    return Table(key, title, ("t (s)", "run", "event", "reason", "details"), tuple(rows), note,
                 text_columns=(2, 3, 4))  # fmt: skip


def run_section(data: RunData, title: str | None = None, intro: str = "") -> Section:
    run = data.run
    pace = iteration_pace(data.progress, run.wall_s)
    work = rank_work(data)
    waiting = [w.waiting_cores for w in work]
    reclaimable = sum(w for w in waiting if w is not None) if all(
        w is not None for w in waiting) and work else None  # fmt: skip
    completed = sum(1 for z in run.resizes if z.status == "completed")
    wait_mode = run.options.get("wait_mode", "-") if run.options.get("shim", True) else "no shim"
    tiles = (
        Tile("status", run.status, ": ".join(filter(None, (run.failure, run.message))),
             "good" if run.status == "completed" else "bad"),
        Tile("wall time", _f(run.wall_s, ".1f", " s"), f"{run.iterations} iterations"),
        Tile("per iteration", (">" if pace.lower_bound else "")
             + _f(pace.seconds_per_iteration, ".3f", " s"), "steady, start-up left out"),
        Tile("CPU used", _f(run.cpu_s, ".1f", " CPU-s"), f"requests total {run.total_millis}m"),
        Tile("resizes", str(completed), f"{len(run.resizes) - completed} refused/unfinished",
             "good" if completed else ""),
        Tile("throttled", str(data.throttled_total), "CFS periods",
             "bad" if data.throttled_total else "good"),
        Tile("waiting CPU", _f(reclaimable, ".2f", " cores"),
             "spent inside MPI: reclaimable", "warn" if reclaimable else ""),
    )  # fmt: skip
    ranks = Table(
        f"run{run.id}-ranks", "Per rank",
        ("rank", "cells", "first request", "last request", "limit", "CPU-s", "CPU (cores)",
         "duty", "computing (cores)", "waiting (cores)", "throttled", "restarts"),
        tuple(
            (str(w.rank), str(w.cells) if w.cells is not None else "-", f"{w.request_first}m",
             f"{w.request_last}m",
             f"{k.limit_millis}m" if k.limit_millis is not None else "-",
             _f(k.cpu_s, ".2f"), _f(w.cpu_cores, ".2f"),
             _f(None if w.duty is None else 100 * w.duty, ".0f", " %"),
             _f(w.computing_cores, ".2f"), _f(w.waiting_cores, ".2f"),
             str(k.nr_throttled or 0), str(k.restarts))
            for w, k in zip(work, run.ranks, strict=True)
        ),
        "duty: steady-state fraction of time computing (PMPI shim); computing / waiting = CPU "
        "use split by the duty cycle",
    )  # fmt: skip
    resizes = Table(
        f"run{run.id}-resizes", "Every resize",
        ("t (s)", "rank", "from", "to", "kind", "outcome", "latency (s)", "reason"),
        tuple(
            (f"{z.t_s:.1f}", str(z.rank), f"{z.from_millis}m", f"{z.to_millis}m", z.kind,
             z.status, _f(z.latency_s, ".3f"), z.reason)
            for z in run.resizes
        ),
        text_columns=(4, 5, 7),
    )  # fmt: skip
    events = _events_table(f"run{run.id}-events", "Controller events", data.events)
    subtitle = (
        f"{run.case_name} ({run.solver}), {run.n_ranks} ranks, {run.decompose} decomposition, "
        f"QoS {run.qos}, wait {wait_mode}, backend {run.backend}; run directory {run.run_dir}"
    )
    return Section(
        key=f"run{run.id}",
        title=title or f"Run {run.id}: {run.case_name}",
        intro=(intro + " " if intro else "") + subtitle,
        tiles=tiles,
        figures=tuple(run_figures(data)),
        tables=(ranks, resizes, events),
    )


def session_section(data: SessionData, title: str | None = None, intro: str = "") -> Section:
    s = data.session
    summary = s.summary
    gain, limit = data.gain, data.limit
    once = summary.get("max_concurrent_seen") == 1
    share = f"{(gain - 1) / (limit - 1):.0%} of the possible gain" if (
        gain and limit and limit > 1.0001 and not once) else ""  # fmt: skip
    idle = summary.get("idle_s")
    apart = [f"{_f(summary.get(k), '.1f', ' s')} {what}" for k, what in (
        ("staged_ahead_s", "staged ahead"), ("idle_s", "idle"),
        ("other_wait_s", "in another wait mode")) if summary.get(k)]  # fmt: skip
    tiles = (
        Tile("co-location gain", _f(gain, ".2f", "x"),
             "never at once: variation" if once else "vs one after another, like for like",
             "" if once else ("good" if gain and gain > 1.02 else
                              ("bad" if gain and gain < 0.98 else ""))),
        Tile("physical limit", _f(limit, ".2f", "x"), share),
        Tile("makespan", _f(summary.get("makespan_s"), ".1f", " s"),
             f"first launch to last end; {idle:.1f} s with none running"
             if isinstance(idle, (int, float)) and idle >= 0.05 else "first launch to last end"),
        Tile("one after another", _f(summary.get("sequential_s"), ".1f", " s"),
             f"baseline: {summary.get('baseline', '-')}"),
        Tile("not in the gain", "; ".join(apart) if apart else "-",
             "other effects, named apart"),
        Tile("most at once", str(summary.get("max_concurrent_seen", "-")),
             f"of at most {s.max_concurrent}"),
        Tile("resizes", str(summary.get("resizes", "-")),
             f"{summary.get('restarts', 0)} restarts"),
        Tile("fairness", _f(summary.get("fairness_ratio"), ".2f"), "max/min wall time"),
    )  # fmt: skip
    base = {b.get("id"): b for b in summary.get("baselines", []) if isinstance(b, dict)}
    sims = Table(
        f"session{s.id}-simulations", "Simulations (against their single-run baselines)",
        ("run", "case", "status", "iterations", "start", "wall (s)", "CPU (s)",
         "baseline wall (s)", "baseline CPU (s)", "started (s)", "ended (s)"),
        tuple(
            (str(x.get("id")), str(x.get("case")), str(x.get("status")),
             f"{x.get('iterations')}/{x.get('expected_iterations')}", str(x.get("start") or "-"),
             _f(x.get("wall_s"), ".1f"), _f(x.get("cpu_s"), ".1f"),
             _f(base.get(x.get("id"), {}).get("wall_s"), ".1f"),
             _f(base.get(x.get("id"), {}).get("cpu_s"), ".1f"),
             _f(x.get("started_s"), ".1f"), _f(x.get("finished_s"), ".1f"))
            for x in summary.get("simulations", [])
        ),
        text_columns=(1, 2, 4),
    )  # fmt: skip
    events = _events_table(f"session{s.id}-events", "Controller events (whole session)",
                           data.events)  # fmt: skip
    return Section(
        key=f"session{s.id}",
        title=title or f"Multiplex session {s.id}",
        intro=(intro + " " if intro else "")
        + f"{s.status}; capacity {s.capacity_millis}m, wait {s.wait_mode}, backend {s.backend}, "
        f"started {s.started_at}. " + ". ".join(gain_lines(summary)) + ".",
        tiles=tiles,
        figures=tuple(session_figures(data)),
        tables=(sims, events),
    )


@dataclass(frozen=True)
class Part:
    """One piece of a report: a run or a multiplex session, with an optional title/intro."""

    run_id: int | None = None
    multiplex_id: int | None = None
    title: str | None = None
    intro: str = ""


def build_report(
    store: Store,
    parts: Sequence[Part],
    *,
    title: str | None = None,
    headline: str | None = None,
    summary: Sequence[str] = (),
) -> ReportDoc:
    """Read every part (UserError for an unknown run or session) into one document; a
    session brings a section for each of its runs."""
    sections: list[Section] = []
    for p in parts:
        if p.multiplex_id is not None:
            data = load_session(store, p.multiplex_id)
            sections.append(session_section(data, p.title, p.intro))
            sections += [run_section(r) for r in data.runs]
        elif p.run_id is not None:
            sections.append(run_section(load_run(store, p.run_id), p.title, p.intro))
    if not sections:
        raise UserError("nothing to report; give a run id or --multiplex ID")
    names = [s.title for s in sections]
    return ReportDoc(
        title=title or "rankpack report: " + ", ".join(names[:3]) + ("..." if len(names) > 3
                                                                     else ""),
        subtitle=f"from {store.path}, written {datetime.now().isoformat(timespec='seconds')}",
        sections=tuple(sections),
        headline=headline,
        summary=tuple(summary),
        footer="rankpack: one cgroup or pod per MPI rank, sized to its measured duty cycle.",
    )  # fmt: skip


def figures_of(doc: ReportDoc) -> list[Figure]:
    return [f for s in doc.sections for f in s.figures]


@dataclass(frozen=True)
class WrittenReport:
    html: Path
    png_dir: Path
    pngs: tuple[Path, ...]


def png_dir_for(html: Path) -> Path:
    """Where a report's PNGs go: beside the page, ``<name>_figures/``."""
    return html.with_name(f"{html.stem}_figures")


def write_report(doc: ReportDoc, html: Path) -> WrittenReport:
    """Write the page and its PNGs; all or nothing (see the module docstring)."""
    html = html.absolute()
    directory = html.parent
    final_pngs = png_dir_for(html)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{html.stem}-", dir=directory))
    except OSError as exc:
        raise UserError(
            f"cannot write the report in {directory} ({exc.strerror}); give another --output"
        ) from None
    old = directory / f".{final_pngs.name}-old-{uuid.uuid4().hex[:8]}"
    moved_old = moved_new = False
    names = []
    try:
        pngs = tmp / final_pngs.name
        pngs.mkdir()
        for f in figures_of(doc):
            (pngs / f"{f.key}.png").write_bytes(f.png)
            names.append(f"{f.key}.png")
        page = tmp / html.name
        page.write_text(render(doc), encoding="utf-8")
        os.chmod(page, 0o644)
        os.chmod(pngs, 0o755)
        if final_pngs.is_symlink() or (final_pngs.exists() and not final_pngs.is_dir()):
            raise UserError(
                f"{final_pngs} exists and is not a directory; move it or give another --output"
            )
        if final_pngs.is_dir():
            final_pngs.rename(old)
            moved_old = True
        pngs.rename(final_pngs)
        moved_new = True
        os.replace(page, html)
    except BaseException as exc:
        # Put back what was there: the page and the figures stay a matching pair.
        if moved_new:
            shutil.rmtree(final_pngs, ignore_errors=True)
        if moved_old:
            old.rename(final_pngs)
        if isinstance(exc, OSError):
            raise UserError(
                f"cannot write the report {html} ({exc.strerror or exc}); give another --output"
            ) from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return WrittenReport(html, final_pngs, tuple(final_pngs / n for n in names))
