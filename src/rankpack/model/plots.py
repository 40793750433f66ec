"""PNG figures in the style of seed 001 Figs. 5-6 (matplotlib, Agg backend).

Called by `rankpack model fit|plan --plot-dir`. The only module here that writes files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


@dataclass(frozen=True)
class ThetaCurve:
    label: str
    n: Sequence[float]
    throughput: Sequence[float]


def plot_throughput(
    path: Path,
    *,
    measured_n: Sequence[int],
    measured_throughput: Sequence[float],
    curves: Sequence[ThetaCurve],
    fitted_max_n: int,
    errors_pct: Sequence[float] | None = None,
) -> Path:
    """Theta(N): measured dots, model curves, shaded extrapolation beyond the fitted range."""
    ncols = 2 if errors_pct is not None else 1
    fig, axes = plt.subplots(1, ncols, figsize=(5.5 * ncols, 4.0), squeeze=False)
    ax = axes[0][0]
    n_hi = max([fitted_max_n, *measured_n, *(max(c.n) for c in curves)])
    ax.axvspan(fitted_max_n, n_hi + 0.3, color="0.85", label="extrapolation")
    ax.plot([1, n_hi], [1, n_hi], "k--", lw=0.8, label="ideal (Θ = N)")
    for c, color in zip(curves, ("tab:red", "tab:blue", "tab:green"), strict=False):
        ax.plot(c.n, c.throughput, "-", color=color, label=c.label)
    ax.plot(measured_n, measured_throughput, "ko", label="measured")
    ax.set_xlabel("concurrent simulations N")
    ax.set_ylabel("throughput gain Θ(N)")
    ax.set_xlim(0.7, n_hi + 0.3)
    ax.legend(fontsize=8)
    ax.set_title("(a) throughput: model vs measured")
    if errors_pct is not None:
        ax2 = axes[0][1]
        colors = ["tab:green" if e >= 0 else "tab:orange" for e in errors_pct]
        ax2.bar(list(measured_n), list(errors_pct), color=colors)
        ax2.axhline(0, color="k", lw=0.8)
        ax2.set_xlabel("concurrent simulations N")
        ax2.set_ylabel("makespan prediction error (%)")
        ax2.set_title("(b) error (> 0: conservative)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_efficiency(
    path: Path,
    *,
    n: Sequence[int],
    efficiency: Sequence[float],
    degradation_pct: Sequence[float],
    knee_n: int | None,
) -> Path:
    """Scheduling efficiency bars and per-simulation degradation bars, knee marked."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11.0, 4.0))
    colors = ["tab:red" if k == knee_n else "tab:blue" for k in n]
    ax1.bar(list(n), [e * 100 for e in efficiency], color=colors)
    ax1.set_ylim(0, 105)
    ax1.set_xlabel("concurrent simulations N")
    ax1.set_ylabel("scheduling efficiency Θ(N)/N (%)")
    ax1.set_title("(a) efficiency" + (f" (knee N={knee_n} in red)" if knee_n else ""))
    ax2.bar(list(n), list(degradation_pct), color="tab:orange")
    ax2.set_xlabel("concurrent simulations N")
    ax2.set_ylabel("per-simulation degradation (%)")
    ax2.set_title("(b) degradation T_N/T_1 - 1")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
