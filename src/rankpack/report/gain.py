"""A session's co-location gain in words, with every other effect named apart (pure).

Read from a session's recorded summary (`rankpack.controller.session.SessionResult.to_json`):
the gain is co-location's alone (like-for-like single runs one after another against the
time at least one simulation ran); idle stretches, staging ahead and a wait mode the single
runs never used are said on lines of their own. Shared by `rankpack multiplex`'s summary,
the HTML report's session section (`build`) and the demo's story (`story`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def gain_lines(summary: Mapping[str, Any]) -> list[str]:
    """The gain (or why none was measured), then one line per other effect."""
    gain, busy, idle = (_num(summary.get(k)) for k in ("throughput_gain", "busy_s", "idle_s"))
    makespan = _num(summary.get("makespan_s")) or 0.0
    span = f"makespan {makespan:.1f} s"
    if busy is not None and idle is not None and idle >= 0.05:
        span += f" ({busy:.1f} s with a simulation running, {idle:.1f} s with none)"
    if gain is None:
        note = summary.get("baseline_note") or "no single-run baseline"
        return [f"{span}; co-location gain: none measured ({note})"]
    sequential = _num(summary.get("sequential_s")) or 0.0
    lines = [
        f"{span}; one after another (single runs that started as they did) "
        f"{sequential:.1f} s; co-location gain {gain:.2f}x"
    ]
    if summary.get("max_concurrent_seen") == 1:
        lines.append("the simulations never ran at once: that gain is run-to-run variation")
    lines += [f"not in the gain: {e}" for e in effects(summary)]
    return lines


def effects(summary: Mapping[str, Any]) -> list[str]:
    """The effects other than co-location, in words (empty: none, or an older summary)."""
    found = summary.get("other_effects")
    return [str(e) for e in found] if isinstance(found, list) else []
