"""A timeline PNG of a multiplex session, like seed 001 Fig. 7: per simulation, solver
execution, profiling windows, resizes, wait-mode switches and launches, from the recorded
events. Called by `rankpack multiplex` (``--plot``); the HTML report draws the same axes
(`rankpack.report.figures.timeline_axes`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rankpack.report.figures import pyplot, timeline_axes
from rankpack.store import EventRow


def plot_timeline(
    events: list[EventRow], path: Path, title: str, labels: Mapping[int, str] | None = None
) -> None:
    plt = pyplot()
    runs = {e.run_id for e in events if e.run_id is not None}
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.7 * max(1, len(runs))))
    timeline_axes(ax, events, labels)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
