"""Per-rank duty-cycle bar chart in the style of seed 001 Fig. 1 (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

from rankpack.profile.sampling import ProfileSummary


def plot_duty(summary: ProfileSummary, path: Path, title: str = "Per-rank CPU duty cycle") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [r.rank for r in summary.ranks]
    compute = [r.compute_s for r in summary.ranks]
    mpi = [r.mpi_s for r in summary.ranks]
    duty = [100.0 * (r.duty or 0.0) for r in summary.ranks]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(max(5.0, 0.5 * len(ranks) + 3), 6), sharex=True
    )
    top.bar(ranks, compute, color="tab:blue", label="compute")
    top.bar(ranks, mpi, bottom=compute, color="tab:blue", alpha=0.3, label="MPI wait")
    top.set_ylabel("time (s)")
    top.legend(loc="upper right")
    top.set_title(title)
    bottom.bar(ranks, duty, color="tab:red")
    bottom.set_ylabel("duty cycle (%)")
    bottom.set_xlabel("rank")
    bottom.set_ylim(0, 100)
    bottom.set_xticks(ranks)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
