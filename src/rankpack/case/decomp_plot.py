"""A picture of a decomposition: cell centres coloured by rank (as in the seed papers' Fig. 3).

Called by ``rankpack decompose --plot``. Uses matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

from pathlib import Path

from rankpack.case.decomposition import DecompositionResult
from rankpack.errors import UserError

_AXIS_NAMES = "xyz"


def plot_decomposition(
    result: DecompositionResult, out: Path, *, max_points: int = 400_000
) -> None:
    """Write a PNG (or any format matplotlib knows from the suffix) of the decomposition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    a, b = result.plane
    xy = result.centres[:, [a, b]]
    part = result.assignment
    if len(xy) > max_points:  # keep big meshes quick to draw; a uniform sample looks the same
        pick = np.random.default_rng(0).choice(len(xy), max_points, replace=False)
        xy, part = xy[pick], part[pick]
    n_ranks = len(result.ranks)
    cmap = plt.get_cmap("tab20" if n_ranks > 10 else "tab10", max(n_ranks, 1))
    size = max(0.05, min(4.0, 20000.0 / max(len(xy), 1)))
    extent = np.ptp(xy, axis=0) if len(xy) else np.ones(2)
    height = float(np.clip(7.0 * extent[1] / max(float(extent[0]), 1e-300), 2.5, 8.0))
    fig, ax = plt.subplots(figsize=(10, height + 1.0), dpi=130)
    for r in result.ranks:
        mask = part == r.rank
        ax.scatter(
            xy[mask, 0],
            xy[mask, 1],
            s=size,
            color=cmap(r.rank % cmap.N),
            label=f"rank {r.rank}: {r.cells} cells (w {r.weight:g})",
            linewidths=0,
            rasterized=True,
        )
    ax.plot(result.center[a], result.center[b], marker="x", color="black", markersize=8)
    ax.set_aspect("equal")
    ax.set_xlabel(_AXIS_NAMES[a])
    ax.set_ylabel(_AXIS_NAMES[b])
    ax.set_title(
        f"{result.case_dir.name}: {result.method.value}, {n_ranks} ranks, "
        f"{result.n_cells} cells, edge cut {result.edge_cut}"
    )
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=7,
        markerscale=max(1.0, 6.0 / size**0.5),
        frameon=False,
    )
    fig.tight_layout()
    try:
        fig.savefig(out)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot write plot {out}: {exc}") from None
    finally:
        plt.close(fig)
