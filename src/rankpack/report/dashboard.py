"""``rankpack dashboard``'s data (pure): what its page draws, accumulated from successive
``rankpack top`` views (`rankpack.report.top`) that the server reads with the user's own
rights, one view per poll.

Per Simulation, by uid (`Track`), each part bounded, the oldest dropped first:

- **residual curve**: (iterations, each field's latest initial residual) whenever the
  status shows a new iteration count; at most `MAX_POINTS` points and `MAX_FIELDS` fields
  (a run resumed from an earlier time step drops the points beyond where it resumed);
- **duty heat map**: every rank's duty (ranks x time) at each poll while it runs, at most
  `MAX_RANKS` ranks and `MAX_CELLS` cells (`MAX_COLUMNS` columns);
- **requests against usage**: each rank's request and CPU use at the last poll, and their
  sums at each poll while it runs (as many as the heat map's columns);
- its recent resizes and wait-mode switches (top's, from Events where they may be read).

At most `MAX_SIMULATIONS` are followed and shown (running ones first); a Simulation no
longer listed is not shown, and is the first dropped when room is needed. Everything comes
from statuses, whose writer is whoever may write them: top leaves out what is not a finite
number, and here each value must be in its range too (`_within`), else it is left out
(drawn as missing), never a crash and never a number made up.

**Co-location gain so far** (`Colocation`), from what the user can see: the work the
visible Simulations did while the dashboard watched, each one's iterations between two
polls at which it ran, priced at its own seconds per iteration *when the dashboard saw it
run alone* (the only running Simulation the user may read, between two polls, for at least
`MIN_SOLO_S` seconds in all), over the wall time during which at least one of them ran.
That is the one-after-another time of the same work over the time it took side by side.
Without a solo rate for every Simulation that did work (or before `MIN_WALL_S` seconds of
it), there is no estimate, and the view says why. Simulations of others (other namespaces,
or any the credentials may not read) are not seen: when they share the nodes, they slow
the solo rates and the side-by-side rates alike.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankpack.report.glance import MAX_RESIDUALS

Obj = dict[str, Any]

MAX_SIMULATIONS = 32
MAX_POINTS = 500
MAX_FIELDS = MAX_RESIDUALS
MAX_RANKS = 64
MAX_COLUMNS = 360
"""Heat-map columns (polls) per Simulation: 30 minutes at the default 5 s."""
MAX_CELLS = 16384
MAX_NAME = 253
"""A Kubernetes object's name is at most 253 characters."""
MIN_SOLO_S = 60.0
"""Seconds a Simulation must be seen running alone before its solo rate is used: the
status shows progress every 10 s, so a shorter window is off by a sixth or more."""
MIN_WALL_S = 60.0
MAX_ITERATIONS = 1e9
MAX_MILLIS = 1e7
MAX_CORES = 1e4
MAX_RESIDUAL = 1e6


def _within(value: Any, low: float, high: float) -> float | None:
    """``value`` if a number in [low, high] (top's view holds finite floats or None)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high:
        return float(value)
    return None


def _name(value: Any) -> str:
    return str(value)[:MAX_NAME] if value is not None else ""


def _rank_id(value: Any, index: int) -> int:
    number = _within(value, 0, 1e6)
    return int(number) if number is not None and number == int(number) else index


def _rank_row(r: Obj, index: int) -> Obj:
    """A rank as the page shows it, each value in its range or None."""
    return {"rank": _rank_id(r.get("rank"), index), "node": r.get("node"),
            "requestMillis": _within(r.get("requestMillis"), 0.0, MAX_MILLIS),
            "cpuCores": _within(r.get("cpuCores"), 0.0, MAX_CORES),
            "duty": _within(r.get("duty"), 0.0, 1.0), "wait": r.get("wait")}  # fmt: skip


@dataclass
class Track:
    """One Simulation's history (see the module's docstring)."""

    uid: str
    name: str
    fields: list[str] = field(default_factory=list)
    points: deque[tuple[int, tuple[float | None, ...]]] = field(
        default_factory=lambda: deque(maxlen=MAX_POINTS)
    )
    ranks: tuple[int, ...] = ()
    columns: deque[tuple[float, tuple[float | None, ...]]] = field(default_factory=deque)
    usage: deque[tuple[float, float, float]] = field(default_factory=deque)
    """(time, the ranks' requests summed in millicores, their CPU use summed in cores)."""
    seen_s: float = 0.0
    counted: int = 0
    """Iterations done between two polls at which it ran (the gain's work)."""
    solo_iterations: int = 0
    solo_s: float = 0.0

    def add_residuals(self, iterations: int, residuals: Mapping[str, Any]) -> None:
        if self.points and iterations < self.points[-1][0]:  # resumed from earlier
            kept = [p for p in self.points if p[0] < iterations]
            self.points = deque(kept, maxlen=MAX_POINTS)
        if self.points and self.points[-1][0] == iterations:
            return
        values = {k: v for k, v in residuals.items() if _within(v, 0.0, MAX_RESIDUAL) is not None}
        for name in sorted(values):
            if name not in self.fields and len(self.fields) < MAX_FIELDS:
                self.fields.append(name)
        row = tuple(values.get(f) for f in self.fields)
        if any(v is not None for v in row):
            self.points.append((iterations, row))

    def add_column(self, now_s: float, ranks: Sequence[Obj]) -> None:
        shown = ranks[:MAX_RANKS]
        ids = tuple(_rank_id(r.get("rank"), i) for i, r in enumerate(shown))
        if ids != self.ranks:  # another set of ranks (a relaunch): another map
            self.ranks = ids
            width = min(MAX_COLUMNS, MAX_CELLS // max(1, len(ids)))
            self.columns = deque(maxlen=width)
            self.usage = deque(maxlen=width)
        if not ids:
            return
        self.columns.append((now_s, tuple(_within(r.get("duty"), 0.0, 1.0) for r in shown)))
        requested = [_within(r.get("requestMillis"), 0.0, MAX_MILLIS) for r in ranks]
        used = [_within(r.get("cpuCores"), 0.0, MAX_CORES) for r in ranks]
        self.usage.append((now_s, round(sum(v or 0.0 for v in requested), 3),
                           round(sum(v or 0.0 for v in used), 3)))  # fmt: skip

    def solo_rate(self) -> float | None:
        """Seconds per iteration seen running alone, once seen so for `MIN_SOLO_S`."""
        if self.solo_s < MIN_SOLO_S or self.solo_iterations <= 0:
            return None
        return self.solo_s / self.solo_iterations

    def drawn(self, now_s: float) -> Obj:
        """The page's data of this Simulation's history (times as seconds before now)."""
        width = len(self.fields)
        return {
            "residuals": {
                "fields": list(self.fields),
                "points": [[i, [*row, *[None] * (width - len(row))]] for i, row in self.points],
            },
            "heat": {
                "ranks": list(self.ranks),
                "columns": [[round(t - now_s, 1), list(d)] for t, d in self.columns],
            },
            "usage": [[round(t - now_s, 1), r, c] for t, r, c in self.usage],
            "soloSecondsPerIteration": self.solo_rate(),
        }


@dataclass
class Colocation:
    """The co-location gain so far (module docstring): wall time with at least one visible
    Simulation running, and the work of those no longer followed."""

    wall_s: float = 0.0
    folded_work_s: float = 0.0
    folded_unknown: int = 0
    """Simulations dropped (room) that had done work without a solo rate."""
    incomplete: bool = False
    """More Simulations ran than are followed: their work is not counted."""
    last_s: float | None = None
    last_running: dict[str, int] = field(default_factory=dict)

    def step(self, now_s: float, running: Mapping[str, int], tracks: Mapping[str, Track]) -> None:
        """Account for the time since the last poll: ``running`` uid -> iterations now."""
        last, self.last_s = self.last_s, now_s
        before, self.last_running = self.last_running, dict(running)
        if last is None or now_s <= last:
            return
        both = running.keys() & before.keys()
        if not both:
            return
        dt = now_s - last
        self.wall_s += dt
        alone = len(running) == 1 and len(before) == 1
        for uid in both:
            done = max(0, running[uid] - before[uid])
            track = tracks[uid]
            track.counted += done
            if alone:
                track.solo_iterations += done
                track.solo_s += dt

    def fold(self, track: Track) -> None:
        """``track`` is dropped: keep its work."""
        if track.counted <= 0:
            return
        rate = track.solo_rate()
        if rate is None:
            self.folded_unknown += 1
        else:
            self.folded_work_s += track.counted * rate

    def gain(self, tracks: Sequence[Track]) -> Obj:
        working = [t for t in tracks if t.counted > 0]
        out: Obj = {"value": None, "workS": None, "wallS": round(self.wall_s, 1),
                    "simulations": len(working), "why": None}  # fmt: skip
        missing = [t.name for t in working if t.solo_rate() is None]
        if self.incomplete:
            out["why"] = f"more Simulations ran than the dashboard follows ({MAX_SIMULATIONS})"
        elif not working and self.folded_work_s <= 0:
            out["why"] = "no Simulation seen running between two polls yet"
        elif self.wall_s < MIN_WALL_S:
            out["why"] = f"watched {self.wall_s:.0f} s of running so far (needs {MIN_WALL_S:.0f})"
        elif missing or self.folded_unknown:
            who = missing[0] if missing else "one no longer shown"
            more = len(missing) + self.folded_unknown - 1
            out["why"] = (f"no solo rate yet for {who}{f' and {more} more' if more else ''}: "
                          f"not seen running alone for {MIN_SOLO_S:.0f} s")  # fmt: skip
        else:
            work = self.folded_work_s + sum(t.counted * (t.solo_rate() or 0.0) for t in working)
            out["workS"] = round(work, 1)
            out["value"] = round(work / self.wall_s, 3)
        return out


def _order(sims: Sequence[Obj]) -> list[Obj]:
    """The Simulations followed: at most `MAX_SIMULATIONS`, running ones first, in top's
    order (oldest first)."""
    running = [s for s in sims if s.get("phase") == "Running"]
    chosen = {id(s) for s in (running + [s for s in sims if s.get("phase") != "Running"])
              [:MAX_SIMULATIONS]}  # fmt: skip
    return [s for s in sims if id(s) in chosen]


class History:
    """Every followed Simulation's `Track` and the `Colocation` gain, fed one top view per
    poll (`observe`); `view` is what the page reads."""

    def __init__(self) -> None:
        self.tracks: dict[str, Track] = {}
        self.colocation = Colocation()
        self.shown: list[Obj] = []
        self.more = 0
        self.nodes: list[Obj] | None = None

    def forget(self) -> None:
        """The credentials may no longer read Simulations: nothing read before is shown,
        nor kept."""
        self.tracks = {}
        self.colocation = Colocation()
        self.shown = []
        self.more = 0
        self.nodes = None

    def observe(self, now_s: float, view: Obj) -> None:
        """One poll's top view (`rankpack.report.top.top_view`) at wall time ``now_s``."""
        sims = [s for s in view.get("simulations") or [] if isinstance(s.get("uid"), str)]
        self.shown = _order(sims)
        self.more = len(view.get("simulations") or []) - len(self.shown)
        self.nodes = view.get("nodes")
        self._follow(now_s)
        running: dict[str, int] = {}
        for sim in self.shown:
            track = self.tracks[sim["uid"]]
            iterations = _within(sim.get("iterations"), 0, MAX_ITERATIONS)
            if iterations is not None:
                track.add_residuals(int(iterations), sim.get("residuals") or {})
            if sim.get("phase") == "Running":
                track.add_column(now_s, sim.get("ranks") or [])
                if iterations is not None:
                    running[sim["uid"]] = int(iterations)
        listed_running = sum(1 for s in sims if s.get("phase") == "Running")
        shown_running = sum(1 for s in self.shown if s.get("phase") == "Running")
        self.colocation.incomplete |= listed_running > shown_running
        self.colocation.step(now_s, running, self.tracks)

    def _follow(self, now_s: float) -> None:
        """A `Track` for each shown Simulation; to make room, the ones not shown that were
        seen longest ago go (their work kept for the gain: `Colocation.fold`)."""
        uids = {s["uid"] for s in self.shown}
        for sim in self.shown:
            track = self.tracks.get(sim["uid"])
            if track is None:
                while len(self.tracks) >= MAX_SIMULATIONS:
                    gone = [t for t in self.tracks.values() if t.uid not in uids]
                    oldest = min(gone, key=lambda t: t.seen_s)
                    self.colocation.fold(self.tracks.pop(oldest.uid))
                track = self.tracks[sim["uid"]] = Track(sim["uid"], "")
            track.name, track.seen_s = _name(sim.get("name")), now_s

    def view(self, now_s: float) -> Obj:
        """The page's data: the followed Simulations (top's fields, ranks bounded) with
        their histories, the nodes (None: may not be read) and the gain so far."""
        out = []
        for sim in self.shown:
            ranks = sim.get("ranks") or []
            shown = {**sim, "name": _name(sim.get("name")),
                     "namespace": _name(sim.get("namespace")),
                     "ranks": [_rank_row(r, i) for i, r in enumerate(ranks[:MAX_RANKS])],
                     "rankCount": len(ranks)}  # fmt: skip
            shown["latestResiduals"] = shown.pop("residuals", None) or {}
            out.append({**shown, **self.tracks[sim["uid"]].drawn(now_s)})
        return {
            "simulations": out,
            "more": self.more,
            "nodes": self.nodes,
            "gain": self.colocation.gain(list(self.tracks.values())),
        }
