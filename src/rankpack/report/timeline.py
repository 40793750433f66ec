"""A timeline PNG of a multiplex session, like seed 001 Fig. 7: per simulation, solver
execution, profiling windows, resizes and launches, from the recorded events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rankpack.store import EventRow


def plot_timeline(events: list[EventRow], path: Path, title: str) -> None:
    # matplotlib is imported here, not at module level: importing it writes a font cache
    # under ~/.cache, which a command that fails on bad input must not do.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sims: dict[int, dict[str, Any]] = {}
    for e in events:
        rid = e.run_id
        if rid is None:
            continue
        s = sims.setdefault(rid, {"launch": None, "end": None, "profile": [], "resizes": []})
        t = float(e.t_s)
        if e.kind == "launch":
            s["launch"] = t
        elif e.kind == "finished":
            s["end"] = t
        elif e.kind == "profile-start":
            s["profile"].append(t)
        elif e.kind == "resize":
            s["resizes"].append((t, e.detail.get("kind", "size")))
    order = sorted(sims, key=lambda r: sims[r]["launch"] or 0.0)
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.6 * max(1, len(order))))
    end_all = max([s["end"] or 0.0 for s in sims.values()] + [1.0])
    colours = {"size": "#d62728", "fairness": "#9467bd", "phase": "#ff7f0e"}
    for y, rid in enumerate(order):
        s = sims[rid]
        start = s["launch"] or 0.0
        end = s["end"] or end_all
        ax.broken_barh(
            [(start, end - start)],
            (y - 0.3, 0.6),
            color="#aec7e8",
            label="solver" if y == 0 else None,
        )
        sized = [t for t, k in s["resizes"] if k == "size"]
        for p in s["profile"]:
            stop = min([t for t in sized if t >= p] or [p])
            ax.broken_barh([(p, max(stop - p, 0.2))], (y - 0.3, 0.6), color="#1f77b4",
                           label="profiling" if y == 0 else None)  # fmt: skip
        for t, kind in s["resizes"]:
            ax.plot([t, t], [y - 0.35, y + 0.35], color=colours.get(kind, "k"), lw=1.5)
        ax.plot([start], [y], marker=">", color="#2ca02c", ms=8, label="launch" if y == 0 else None)
    for kind, colour in colours.items():
        ax.plot([], [], color=colour, lw=1.5, label=f"resize ({kind})")
    ax.set_yticks(range(len(order)), [f"run {r}" for r in order])
    ax.set_xlabel("time since the multiplexer started (s)")
    ax.set_title(title)
    ax.set_xlim(0, end_all * 1.02)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=6, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
