"""The timeline of an operator session (`rankpack operator --plot FILE`), drawn by the same
`report.timeline.plot_timeline` as `rankpack multiplex --plot`.

An operator session may follow runs that earlier operators launched (it adopted them after
a crash or a lost Lease): their events are in those operators' sessions, with times counted
from each session's start. They are put on this session's time axis through the sessions'
start times, so a run's whole life — launch, profiling, resizes, the end — is one bar.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from rankpack.report.timeline import plot_timeline
from rankpack.store import EventRow, Store


def _at(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()


def session_events(store: Store, multiplex_id: int) -> list[EventRow]:
    """The session's events and those of every run it touched, on the session's clock; an
    ``adopted`` event stands for the launch of a run whose launch is not recorded."""
    starts = {s.id: _at(s.started_at) for s in store.multiplex_sessions()}
    origin = starts.get(multiplex_id, 0.0)
    own = store.events(multiplex_id=multiplex_id)
    runs = sorted({e.run_id for e in own if e.run_id is not None})
    seen = {e.id for e in own}
    earlier = [e for rid in runs for e in store.events(run_id=rid) if e.id not in seen]
    out = []
    for e in [*own, *earlier]:
        shift = starts.get(e.multiplex_id, origin) - origin if e.multiplex_id else 0.0
        out.append(replace(e, t_s=round(e.t_s + shift, 3)))
    out.sort(key=lambda e: (e.t_s, e.id))
    launched = {e.run_id for e in out if e.kind == "launch"}
    for i, e in enumerate(out):
        if e.kind == "adopted" and e.run_id not in launched:
            out[i] = replace(e, kind="launch")
            launched.add(e.run_id)
    return out


def plot_session(
    store: Store, multiplex_id: int, path: Path, title: str, names: Mapping[int, str]
) -> int:
    """Write the PNG, each run labelled with its Simulation's name (``names``: run id ->
    name); returns how many runs it shows."""
    events = session_events(store, multiplex_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    plot_timeline(events, path, title, names)
    return len({e.run_id for e in events if e.run_id is not None})
