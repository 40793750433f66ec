"""What else than co-location made a session differ from its single runs (pure).

A session's gain is co-location's: its simulations' single-run baselines one after another
(like for like: `rankpack.controller.baselines`) against the time while at least one of
them ran (``busy_s``). Other effects are measured here and named apart, never folded in:

- ``idle_s``: stretches between the first launch and the last end with none of them
  running (a case still staging, a launch not made yet): the makespan counts them, the
  gain does not (single runs' wall times count no staging either);
- ``staged_ahead_s``: staging of its simulations done while another of them ran
  (`LoopSettings.prestage`): it is hidden from the makespan, and takes CPU from the run
  beside it;
- ``other_wait_s``: seconds a simulation's ranks waited, while it ran alone, in a wait
  mode its single-run baselines never used (the wait rule saw other work on the node, or
  a switch came late): not co-location's either.

Intervals are ``(start, end)`` on one clock. Called by `rankpack.controller.session`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Span = tuple[float, float]


def union(spans: Iterable[Span]) -> list[Span]:
    """The spans merged where they touch or overlap, in order (empty ones dropped)."""
    out: list[Span] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(spans: Iterable[Span]) -> float:
    return sum(b - a for a, b in union(spans))


def overlap(span: Span, spans: Iterable[Span]) -> float:
    """Seconds of ``span`` that fall inside ``spans``."""
    a, b = span
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in union(spans))


def within(span: Span, spans: Iterable[Span]) -> list[Span]:
    """The parts of ``span`` inside ``spans``."""
    a, b = span
    return [(max(a, x), min(b, y)) for x, y in union(spans) if min(b, y) > max(a, x)]


def minus(span: Span, spans: Iterable[Span]) -> list[Span]:
    """The parts of ``span`` outside ``spans``."""
    out: list[Span] = []
    t, b = span
    for x, y in union(spans):
        if y <= t or x >= b:
            continue
        if x > t:
            out.append((t, x))
        t = max(t, y)
    if t < b:
        out.append((t, b))
    return out


def mode_spans(changes: Sequence[tuple[float, str]], end: float) -> list[tuple[str, Span]]:
    """Each wait mode and when it held: ``changes`` are (time, mode) from the launch on, in
    order; the last holds until ``end``."""
    out = []
    for i, (t, mode) in enumerate(changes):
        until = changes[i + 1][0] if i + 1 < len(changes) else end
        if until > t:
            out.append((mode, (t, until)))
    return out


def seconds_by_mode(changes: Sequence[tuple[float, str]], end: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for mode, (a, b) in mode_spans(changes, end):
        out[mode] = round(out.get(mode, 0.0) + b - a, 3)
    return out


@dataclass(frozen=True)
class SimSpans:
    """One simulation of a session, on the session's clock."""

    run_id: int
    run: Span
    """Launch to end."""
    staging: Span | None = None
    """When its case began staging (at its claim, or ahead of it) to when it was staged;
    None: not known."""
    waits: tuple[tuple[float, str], ...] = ()
    """(time, mode) of its ranks' wait mode at launch and at each switch."""
    baseline_modes: frozenset[str] | None = None
    """The wait modes its single-run baselines ran in (None: not known, e.g. recorded
    before launches recorded theirs)."""


@dataclass(frozen=True)
class Effects:
    busy_s: float
    """Seconds from the first launch to the last end with at least one of them running:
    the gain's denominator."""
    idle_s: float
    """Seconds between the first launch and the last end with none of them running."""
    staged_ahead_s: float
    """Seconds of their staging done while another of them ran."""
    other_wait_s: float
    """Seconds a simulation ran alone with its ranks in a wait mode its baselines never
    used (summed over simulations)."""
    notes: tuple[str, ...]
    """Each effect in words, one line each (empty: none)."""


def session_effects(sims: Sequence[SimSpans]) -> Effects:
    spans = [s.run for s in sims]
    if not spans:
        return Effects(0.0, 0.0, 0.0, 0.0, ())
    makespan = max(b for _, b in spans) - min(a for a, _ in spans)
    busy = length(spans)
    notes: list[str] = []
    idle = max(0.0, makespan - busy)
    if idle >= 0.05:
        notes.append(
            f"idle {idle:.1f} s: between the first launch and the last end none ran "
            "(a staging or a launch not done ahead); not in the gain"
        )
    ahead = 0.0
    for s in sims:
        if s.staging is None:
            continue
        hidden = overlap(s.staging, [o.run for o in sims if o.run_id != s.run_id])
        if hidden >= 0.05:
            ahead += hidden
            notes.append(
                f"run {s.run_id} was staged ahead: {hidden:.1f} s of its staging ran beside "
                "another run (hidden from the makespan, it took CPU from that run); not "
                "co-location"
            )
    other = 0.0
    for s in sims:
        if s.baseline_modes is None or not s.waits:
            continue
        alone = minus(s.run, [o.run for o in sims if o.run_id != s.run_id])
        odd: dict[str, float] = {}
        for mode, span in mode_spans(s.waits, s.run[1]):
            if mode not in s.baseline_modes:
                odd[mode] = odd.get(mode, 0.0) + length(within(span, alone))
        for mode, secs in odd.items():
            if secs >= 0.05:
                other += secs
                base = "/".join(sorted(s.baseline_modes)) or "-"
                notes.append(
                    f"run {s.run_id} waited {mode} for {secs:.1f} s while it ran alone "
                    f"(its single-run baseline: {base}); not co-location"
                )
    return Effects(round(busy, 3), round(idle, 3), round(ahead, 3), round(other, 3),
                   tuple(notes))  # fmt: skip
