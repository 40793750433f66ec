"""The report's figures, drawn with matplotlib (Agg) into PNG bytes.

One function per figure; each takes the plain series of `rankpack.report.data` and returns
a `Figure` (id, title, caption, PNG). A figure whose data is missing (a run without the
shim has no duty cycles; a run whose log was deleted has no residuals) is still drawn, with
the reason written in it, so a report always has the same figures. Called by
`rankpack.report.build`.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankpack.report.data import RunData, SessionData
from rankpack.store import EventRow

RANK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
RESIZE_COLOURS = {"size": "#d62728", "fairness": "#9467bd", "phase": "#ff7f0e"}
DPI = 100
MAX_RANK_PANELS = 8
"""More ranks than this share one panel (a panel per rank would be unreadable)."""


@dataclass(frozen=True)
class Figure:
    key: str
    """Stable name: the PNG's file name and the HTML element's id."""
    title: str
    caption: str
    png: bytes


def pyplot() -> Any:
    # Imported here, not at module level: importing matplotlib writes a font cache under
    # ~/.cache, which a command that fails on bad input must not do.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.25,
            "font.size": 9,
            "axes.titlesize": 10,
            "axes.titleweight": "bold",
            "figure.facecolor": "white",
        }
    )
    return plt


def _png(fig: Any) -> bytes:
    plt = pyplot()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def _colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def _empty_note(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#555555",
            fontsize=10, wrap=True)  # fmt: skip


def _end_s(data: RunData) -> float:
    last = [r.t_s[-1] for r in data.ranks if r.t_s]
    return max([*last, data.run.wall_s or 0.0, 1.0])


# -- one run ------------------------------------------------------------------------------


def requests_figure(data: RunData, prefix: str) -> Figure:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.4))
    run = data.run
    for r in data.ranks:
        if not r.t_s:
            continue
        ax.step([0.0, *r.t_s], [r.request_millis[0], *r.request_millis], where="post",
                color=_colour(r.rank), lw=1.8, label=f"rank {r.rank} request")  # fmt: skip
    for k in run.ranks:
        if k.limit_millis is not None:
            ax.axhline(k.limit_millis, color=_colour(k.rank), ls=":", lw=1.2,
                       label=f"rank {k.rank} limit")  # fmt: skip
    kinds_seen = set()
    for z in run.resizes:
        colour = RESIZE_COLOURS.get(z.kind, "black")
        done = z.status == "completed"
        label = f"resize ({z.kind})" if z.kind not in kinds_seen else None
        kinds_seen.add(z.kind)
        ax.plot([z.t_s], [z.to_millis], marker="o" if done else "x", ms=7, color=colour,
                mfc=colour if done else "none", ls="none", label=label, zorder=5)  # fmt: skip
        label_text = f"{z.from_millis}\u2192{z.to_millis}m"
        ax.annotate(label_text, (z.t_s, z.to_millis), textcoords="offset points",
                    xytext=(4, 5), fontsize=7, color=colour)  # fmt: skip
    if not data.ranks or not any(r.t_s for r in data.ranks):
        _empty_note(ax, "no samples recorded for this run")
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("CPU request (millicores)")
    ax.set_xlim(0, _end_s(data) * 1.02)
    ax.set_ylim(bottom=0)
    ax.set_title(f"run {run.id}: per-rank CPU requests over time, {len(run.resizes)} resizes")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    completed = sum(1 for z in run.resizes if z.status == "completed")
    caption = (
        f"Each rank's CPU request (a scheduling weight, not a cap unless a limit is drawn) "
        f"as the controller set it; dots mark in-place resizes ({completed} completed, "
        f"{len(run.resizes) - completed} refused or unfinished, crosses), labelled from\u2192to."
    )
    return Figure(f"{prefix}-requests", "Requests and resizes", caption, _png(fig))


def cpu_figure(data: RunData, prefix: str) -> Figure:
    plt = pyplot()
    ranks = [r for r in data.ranks if r.t_s]
    panels = min(len(ranks), MAX_RANK_PANELS) or 1
    fig, axes = plt.subplots(panels, 1, figsize=(9, 1.0 + 1.5 * panels), sharex=True,
                             squeeze=False)  # fmt: skip
    limits = {k.rank: k.limit_millis for k in data.run.ranks}
    for i, r in enumerate(ranks):
        ax = axes[min(i, panels - 1)][0]
        mid, rate = r.cpu_cores()
        colour = _colour(r.rank)
        ax.fill_between(mid, rate, step=None, alpha=0.35, color=colour, lw=0)
        ax.plot(mid, rate, color=colour, lw=1.2, label=f"rank {r.rank} CPU use")
        ax.step([0.0, *r.t_s], [r.request_millis[0] / 1000, *(m / 1000 for m in r.request_millis)],
                where="post", color="black", lw=1.0, ls="--",
                label="request" if i == 0 else None)  # fmt: skip
        if limits.get(r.rank) is not None:
            ax.axhline((limits[r.rank] or 0) / 1000, color="#d62728", lw=1.0, ls=":",
                       label="limit (cap)")  # fmt: skip
        if panels == len(ranks):
            ax.set_ylabel(f"rank {r.rank}\ncores")
        ax.set_ylim(bottom=0)
        ax.legend(loc="lower right", fontsize=7, frameon=True, framealpha=0.85, ncol=3)
    if not ranks:
        _empty_note(axes[0][0], "no samples recorded for this run")
    axes[-1][0].set_xlabel("seconds since launch")
    axes[0][0].set_title(f"run {data.run.id}: CPU use against requests")
    caption = (
        "CPU each rank used (cores, from its rank pod's usage counter at ~1 Hz) against its "
        "request (dashed). Requests only: a rank may use more than its request when the "
        "machine has idle CPU; a spinning rank uses a full core even while it waits in MPI."
    )
    return Figure(f"{prefix}-cpu", "CPU use against requests", caption, _png(fig))


def duty_figure(data: RunData, prefix: str) -> Figure:
    plt = pyplot()
    times, matrix = data.duty_matrix()
    n = max(1, len(matrix))
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.45 * n + 0.8))
    known = [v for row in matrix for v in row if not math.isnan(v)]
    if known and len(times) >= 1:
        import numpy as np

        edges = [0.0, *times] if times[0] > 0 else [*times, times[-1] + 1.0]
        grid = np.ma.masked_invalid(np.asarray(matrix, dtype=float))
        cmap = plt.get_cmap("viridis").with_extremes(bad="#e6e6e6")
        mesh = ax.pcolormesh(edges[: len(times) + 1], np.arange(n + 1) - 0.5, grid, cmap=cmap,
                             vmin=0.0, vmax=1.0, shading="flat")  # fmt: skip
        bar = fig.colorbar(mesh, ax=ax, pad=0.01)
        bar.set_label("duty cycle (computing)")
        ax.set_yticks(range(n), [f"rank {i}" for i in range(n)])
        ax.invert_yaxis()
        ax.grid(False)
        caption = (
            "Fraction of each interval each rank spent computing rather than waiting inside "
            "MPI (PMPI shim). Dark: the rank mostly waits for the others; its CPU could "
            "serve another simulation. Grey: not measured yet (start-up)."
        )
    else:
        _empty_note(ax, "no duty cycles recorded: this run ran without the PMPI shim "
                        "(or ended before its ranks published a record)")  # fmt: skip
        ax.set_yticks([])
        caption = "Duty cycles need the PMPI shim (rankpack's default); this run had none."
    ax.set_xlabel("seconds since launch")
    ax.set_title(f"run {data.run.id}: duty cycle per rank over time")
    return Figure(f"{prefix}-duty", "Duty-cycle heat-map", caption, _png(fig))


def throttle_figure(data: RunData, prefix: str) -> Figure:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 2.8))
    total = 0
    for r in data.ranks:
        if not r.t_s:
            continue
        ax.step([0.0, *r.t_s], [0, *r.nr_throttled], where="post", color=_colour(r.rank),
                lw=1.6, label=f"rank {r.rank}")  # fmt: skip
        total += r.nr_throttled[-1] if r.nr_throttled else 0
    limited = any(k.limit_millis is not None for k in data.run.ranks)
    if total == 0:
        _empty_note(ax, "no throttling: " + ("limits set but never reached" if limited
                                             else "requests only, no CPU cap"))  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.set_xlim(0, _end_s(data) * 1.02)
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("throttled periods\n(cumulative)")
    ax.set_title(f"run {data.run.id}: CFS throttling, {data.throttled_total} periods")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=8, frameon=False)
    caption = (
        "CFS periods (100 ms) in which a rank hit its CPU limit and was stopped until the next "
        "period. A throttled rank stalls every other rank at the next MPI collective, which "
        "is why rankpack sets requests, not limits."
    )
    return Figure(f"{prefix}-throttling", "Throttling", caption, _png(fig))


def progress_figure(data: RunData, prefix: str) -> Figure:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    if data.progress:
        t = [0.0, *(p[0] for p in data.progress)]
        it = [0, *(p[1] for p in data.progress)]
        left.plot(t, it, color="#1f77b4", lw=1.8)
        if data.run.expected_iterations:
            left.axhline(data.run.expected_iterations, color="#7f7f7f", ls="--", lw=1,
                         label=f"end: {data.run.expected_iterations}")  # fmt: skip
            left.legend(loc="lower right", fontsize=8, frameon=False)
    else:
        _empty_note(left, "no progress recorded")
    left.set_xlabel("seconds since launch")
    left.set_ylabel("iterations done")
    left.set_ylim(bottom=0)
    left.set_title("solver progress")
    log = data.log
    if log.found and log.residuals:
        for name, points in sorted(log.residuals.items()):
            right.semilogy([p[0] for p in points], [max(p[1], 1e-300) for p in points], lw=1.2,
                           label=name)  # fmt: skip
        right.legend(loc="upper right", fontsize=7, frameon=False, ncol=2)
    else:
        why = "solver log not found" if not log.found else "no residuals in the solver log"
        _empty_note(right, why)
    right.set_xlabel("iteration")
    right.set_ylabel("initial residual")
    right.set_title("residuals")
    caption = (
        "Left: iterations done over time, from the solver log as the controller read it. "
        "Right: each field's initial residual per iteration"
        + (f" (from {log.path})." if log.found else f" (the log {log.path} is gone).")
    )
    return Figure(f"{prefix}-progress", "Solver progress and residuals", caption, _png(fig))


def run_figures(data: RunData) -> list[Figure]:
    prefix = f"run{data.run.id}"
    return [
        requests_figure(data, prefix),
        cpu_figure(data, prefix),
        duty_figure(data, prefix),
        throttle_figure(data, prefix),
        progress_figure(data, prefix),
    ]


# -- a session ----------------------------------------------------------------------------


def timeline_axes(
    ax: Any, events: Sequence[EventRow], labels: Mapping[int, str] | None = None
) -> None:
    """Per simulation: solver time, profiling windows, resizes, wait-mode switches and
    launches, from the recorded events (seed 001 Fig. 7). A run is labelled "run ID", or
    "run ID: NAME" where ``labels`` names it (the operator: its Simulation)."""
    sims: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.run_id is None:
            continue
        s = sims.setdefault(e.run_id, {"launch": None, "end": None, "profile": [],
                                       "resizes": [], "wait": []})  # fmt: skip
        t = float(e.t_s)
        if e.kind == "launch":
            s["launch"] = t
        elif e.kind == "finished":
            s["end"] = t
        elif e.kind == "profile-start":
            s["profile"].append(t)
        elif e.kind == "resize":
            s["resizes"].append((t, e.detail.get("kind", "size")))
        elif e.kind == "wait-mode":
            s["wait"].append((t, str(e.detail.get("mode", ""))))
    order = sorted(sims, key=lambda r: sims[r]["launch"] or 0.0)
    end_all = max([s["end"] or 0.0 for s in sims.values()] + [1.0])
    for y, rid in enumerate(order):
        s = sims[rid]
        start = s["launch"] or 0.0
        end = s["end"] or end_all
        ax.broken_barh([(start, end - start)], (y - 0.3, 0.6), color="#aec7e8",
                       label="solver" if y == 0 else None)  # fmt: skip
        sized = [t for t, k in s["resizes"] if k == "size"]
        for p in s["profile"]:
            stop = min([t for t in sized if t >= p] or [p])
            ax.broken_barh([(p, max(stop - p, 0.2))], (y - 0.3, 0.6), color="#1f77b4",
                           label="profiling" if y == 0 else None)  # fmt: skip
        for t, kind in s["resizes"]:
            ax.plot([t, t], [y - 0.35, y + 0.35], color=RESIZE_COLOURS.get(kind, "k"), lw=1.5)
        for t, mode in s["wait"]:
            ax.plot([t], [y + 0.42], marker="v", color="#17becf", ms=6)
            ax.annotate(mode, (t, y + 0.42), textcoords="offset points", xytext=(3, 2),
                        fontsize=7, color="#17becf")  # fmt: skip
        ax.plot([start], [y], marker=">", color="#2ca02c", ms=8, label="launch" if y == 0 else None)
    for kind, colour in RESIZE_COLOURS.items():
        ax.plot([], [], color=colour, lw=1.5, label=f"resize ({kind})")
    ax.plot([], [], marker="v", color="#17becf", ls="none", label="wait mode")
    names = labels or {}
    ax.set_yticks(range(len(order)), [f"run {r}: {names[r]}" if r in names else f"run {r}"
                                      for r in order])  # fmt: skip
    ax.set_xlabel("seconds since the session started")
    ax.set_xlim(0, end_all * 1.02)
    ax.set_ylim(-0.7, max(len(order), 1) - 0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=7, fontsize=8, frameon=False)


def timeline_figure(session: SessionData) -> Figure:
    plt = pyplot()
    n = max(1, len(session.runs))
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.7 * n))
    timeline_axes(ax, session.events)
    ax.set_title(f"multiplex session {session.session.id}: {len(session.runs)} simulations")
    caption = (
        "Each simulation from launch to end: profiling windows (dark), in-place resizes "
        "(vertical ticks), switches of the ranks' wait mode (triangles: spin alone, polite "
        "while sharing)."
    )
    return Figure(f"session{session.session.id}-timeline", "Session timeline", caption, _png(fig))


def gain_figure(session: SessionData) -> Figure:
    plt = pyplot()
    summary = session.session.summary
    sequential = summary.get("sequential_s")
    busy = summary.get("busy_s") or summary.get("makespan_s")  # (older sessions: makespan)
    gain, limit = session.gain, session.limit
    fig, ax = plt.subplots(figsize=(9, 2.6))
    if isinstance(sequential, (int, float)) and isinstance(busy, (int, float)) and busy:
        rows = [("one after another\n(single runs, like for like)", float(sequential),
                 "#7f7f7f", "1.00x"),
                ("multiplexed\n(measured, while any ran)", float(busy), "#2ca02c",
                 f"{gain:.2f}x" if gain else "-")]  # fmt: skip
        if limit:
            rows.append(("physical limit\n(work-conserving)", float(sequential) / limit,
                         "#1f77b4", f"{limit:.2f}x"))  # fmt: skip
        labels = [r[0] for r in rows]
        ax.barh(labels, [r[1] for r in rows], color=[r[2] for r in rows], height=0.6)
        for i, r in enumerate(rows):
            ax.text(r[1], i, f"  {r[1]:.1f} s  ({r[3]} throughput)", va="center", fontsize=9)
        ax.invert_yaxis()
        ax.set_xlim(0, max(r[1] for r in rows) * 1.45)
        ax.set_xlabel("seconds to finish all simulations")
        caption = (
            "Time to run the session's simulations one after another (median of recorded "
            "single runs of each that started as it did: at learned sizes, or profiled), as "
            "measured multiplexed while at least one of them ran, and the least any "
            "co-location could take on this capacity (the physical limit of the gain: the "
            "cores the simulations compute on alone, from their duty cycles). Neither side "
            "counts staging or idle stretches: those, staging ahead and other wait modes "
            "are named apart, not in the gain."
        )
    else:
        _empty_note(ax, "no gain: the session has no single-run baseline "
                        f"({summary.get('baseline', 'none')}) or did not complete")  # fmt: skip
        ax.set_yticks([])
        caption = "The gain needs recorded single runs of the same simulations."
    ax.set_title(f"multiplex session {session.session.id}: co-location gain against the limit")
    return Figure(f"session{session.session.id}-gain", "Gain against the limit", caption,
                  _png(fig))  # fmt: skip


def session_figures(session: SessionData) -> list[Figure]:
    return [timeline_figure(session), gain_figure(session)]


# -- the scale benchmark (issue 29) -------------------------------------------------------


def scale_fill_png(runs: Sequence[Mapping[str, Any]]) -> bytes:
    """PNG: cluster fill (requested / allocatable cores) over virtual time, one line per
    run of `bench/scale.py` (its JSON results), with the 5-minute mark; each run's fill
    at 5 minutes and makespan over its work-conserving bound in the legend."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.2))
    for i, run in enumerate(runs):
        series = run.get("fill_series") or []
        ratio = run.get("makespan_over_bound")
        shown = f"x{ratio:.2f} the bound" if ratio is not None else "stopped"
        label = (
            f"{run['nodes']} nodes, {run['sims']} x {run['ranks']} ranks: "
            f"{100 * run.get('fill_at_5min', 0):.0f} % at 5 min, makespan {shown}"
        )
        ax.plot([p[0] / 60 for p in series], [100 * p[1] for p in series], color=_colour(i),
                linewidth=1.3, label=label)  # fmt: skip
    ax.axvline(5.0, color="#555555", linestyle=":", linewidth=1)
    ax.set_xlabel("virtual time since submission (min)")
    ax.set_ylabel("requested / allocatable cores (%)")
    ax.set_ylim(0, 105)
    ax.set_title("Cluster fill on the simulated cluster (bench/scale.py)")
    ax.legend(fontsize=7, loc="lower right")
    return _png(fig)
