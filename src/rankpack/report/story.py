"""The demo's story in numbers and words: what each step measured, the closing summary
(a headline and a few plain sentences), the terminal tables and the JSON.

Pure: the numbers come in as values (`Hazard`, `RanksStep`, `Payoff`), measured by
`rankpack demo` (`rankpack.cli.demo_cmd`), which prints what this module writes. Nothing
here runs anything; every sentence says what was measured, including when there was no
gain and why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich.table import Table

from rankpack.core.results import ResizeRecord
from rankpack.model.limit import gain_limit
from rankpack.report.data import IterationPace, RankWork
from rankpack.report.gain import effects
from rankpack.store import EventRow


@dataclass(frozen=True)
class Workload:
    case: str
    """The case the runs used (a refined copy's name, e.g. pitzDaily-x2)."""
    source: str
    refine: int
    cells: int | None
    cell_weights: tuple[float, ...]
    iterations: int
    budget_millis: int
    """Each simulation's CPU requests together (half the machine: two share it)."""
    capacity_millis: int
    """This machine's CPUs, in millicores."""

    @property
    def cores(self) -> float:
        return self.capacity_millis / 1000


@dataclass(frozen=True)
class HazardRun:
    qos: str
    """requests | limits"""
    run_id: int
    status: str
    stopped_at_bound: bool
    iterations: int
    wall_s: float
    pace: IterationPace
    throttled: int
    throttled_s: float


@dataclass(frozen=True)
class Hazard:
    plan_millis: tuple[int, ...]
    iterations_bound: int
    time_bound_s: float
    requests: HazardRun
    limits: HazardRun

    @property
    def slowdown(self) -> float | None:
        a, b = self.requests.pace.seconds_per_iteration, self.limits.pace.seconds_per_iteration
        return b / a if a and b else None

    @property
    def at_least(self) -> bool:
        """The limited run's pace is a lower bound (it did not finish two iterations)."""
        return self.limits.pace.lower_bound


@dataclass(frozen=True)
class RanksStep:
    run_id: int
    status: str
    wall_s: float
    work: tuple[RankWork, ...]
    resizes: tuple[ResizeRecord, ...]
    restarts: int
    capacity_cores: float

    @property
    def measured(self) -> bool:
        return bool(self.work) and all(w.duty is not None for w in self.work)

    @property
    def waiting_cores(self) -> float | None:
        return sum(w.waiting_cores or 0.0 for w in self.work) if self.measured else None

    @property
    def computing_cores(self) -> float | None:
        return sum(w.computing_cores or 0.0 for w in self.work) if self.measured else None

    @property
    def limit_of_two(self) -> float | None:
        c1 = self.computing_cores
        return None if c1 is None else gain_limit(2, c1, self.capacity_cores)

    @property
    def completed_resizes(self) -> list[ResizeRecord]:
        return [z for z in self.resizes if z.status == "completed"]


@dataclass(frozen=True)
class Payoff:
    multiplex_id: int
    status: str
    gain: float | None
    limit: float | None
    makespan_s: float
    sequential_s: float | None
    baseline: str
    max_concurrent_seen: int
    resizes: int
    restarts: int
    wait_switches: int
    held: tuple[str, ...]
    """Why launches were held back (launch-held events but the cooldown's, see
    `held_reasons`), in order."""
    timeline_png: str
    session: dict[str, Any] = field(default_factory=dict)
    busy_s: float | None = None
    """Seconds with at least one of them running: what the gain compares with one after
    the other (None: a story recorded before it was; the makespan stands in)."""

    @property
    def together_s(self) -> float:
        return self.busy_s if self.busy_s else self.makespan_s


@dataclass(frozen=True)
class Story:
    workload: Workload
    hazard: Hazard | None = None
    ranks: RanksStep | None = None
    payoff: Payoff | None = None
    load_start: float | None = None
    load_end: float | None = None
    interrupted: bool = False
    failed: str | None = None
    """Why the demo stopped early other than by the user (a run failed)."""
    report_html: str | None = None


# -- words --------------------------------------------------------------------------------


def held_reasons(events: list[EventRow]) -> tuple[str, ...]:
    """The reasons of a session's ``launch-held`` events, in order, but the cooldown's: a
    launch that waited out the cooldown after the one before says nothing about why
    simulations did or did not gain from running together."""
    return tuple(
        str(e.detail.get("reason", ""))
        for e in events
        if e.kind == "launch-held" and e.detail.get("code") != "cooldown"
    )


def headline(story: Story) -> str:
    p = story.payoff
    if story.failed:
        return f"The demo stopped early, so no gain was measured: {story.failed}."
    if story.interrupted or p is None:
        return "The demo was interrupted before its payoff step: no gain was measured."
    limit = f"{p.limit:.2f}x" if p.limit else "unknown (no duty cycles)"
    cores = f"{story.workload.cores:g} cores"
    if p.status != "completed" or p.gain is None:
        return (
            f"No throughput gain measured: the multiplex session {p.status} "
            f"(baseline: {p.baseline}); the physical limit on {cores} is {limit}."
        )
    if p.max_concurrent_seen < 2:
        why = p.held[-1] if p.held else "the launch gate did not start a second simulation"
        return (
            f"No co-location gain on this machine: rankpack held the second simulation back "
            f"({why}), so the two ran one after the other (measured {p.gain:.2f}x: run-to-run "
            f"variation, not co-location); the physical limit on {cores} is {limit}."
        )
    if p.limit and p.gain > 1.05 * p.limit:
        return (
            f"Measured {p.gain:.2f}x ({p.together_s:.1f} s together against "
            f"{p.sequential_s or 0:.1f} s one after the other), more than the physical limit "
            f"{limit} allows on {cores}: other work on this machine slowed the single run it "
            "is compared with (or changed between them), so this gain is not sound; run the "
            "demo again on a quiet machine."
        )
    if p.gain >= 1.02:
        return (
            f"Two simulations multiplexed on {cores} finished in {p.together_s:.1f} s instead "
            f"of {p.sequential_s or 0:.1f} s one after the other: {p.gain:.2f}x the "
            f"throughput, against a physical limit of {limit}."
        )
    return (
        f"Co-locating two simulations gained nothing here: {p.gain:.2f}x "
        f"({p.together_s:.1f} s together against {p.sequential_s or 0:.1f} s one after the "
        f"other), although the physical limit on {cores} is {limit}."
    )


def summary_lines(story: Story) -> list[str]:
    """The demo's conclusions, one paragraph each: why the ranks were resized, the hazard
    of limits, this machine's limit, cautions about the gain, and how the machine was."""
    w, r, h, p = story.workload, story.ranks, story.hazard, story.payoff
    out: list[str] = []
    if r is not None and r.measured:
        out.append(_why_line(r, p))
    if h is not None:
        out.append(_hazard_line(h))
    if r is not None and r.measured and r.computing_cores is not None:
        out.append(_limit_line(w, r, r.computing_cores, p))
    if p is not None:
        out.extend(_payoff_cautions(p))
    out.append(_load_line(story.load_start, w.cores))
    return out


def _why_line(r: RanksStep, p: Payoff | None) -> str:
    busiest = max(r.work, key=lambda x: x.cells or 0)
    idlest = min(r.work, key=lambda x: x.duty if x.duty is not None else 1.0)
    total_cells = sum(x.cells or 0 for x in r.work) or 1
    resized = ", ".join(
        f"rank {z.rank} {z.from_millis}m->{z.to_millis}m" for z in r.completed_resizes[:4]
    )
    sharing = (
        " While the two simulations shared the cores, their waiting ranks were switched "
        "live to polite waiting (back off instead of spinning), which gives those cores "
        "to the other simulation."
        if p is not None and p.wait_switches
        else ""
    )
    return (
        f"Why: rank {idlest.rank} holds {(idlest.cells or 0) / total_cells:.0%} of the "
        f"cells and computed {idlest.duty or 0:.0%} of the time (rank {busiest.rank}: "
        f"{busiest.duty or 0:.0%}); spinning in MPI, the ranks spent "
        f"{r.waiting_cores or 0:.2f} of {r.capacity_cores:g} cores waiting. rankpack "
        f"measured that live and resized the ranks in place"
        + (f" ({resized}; {r.restarts} restarts)." if resized else " (no change needed).")
        + sharing
    )


def _hazard_line(h: Hazard) -> str:
    slow = h.slowdown
    pace_l, pace_r = h.limits.pace.seconds_per_iteration, h.requests.pace.seconds_per_iteration
    plan = "/".join(f"{m}m" for m in h.plan_millis)
    if slow is not None and slow < 1.1 and not h.at_least:
        return (
            f"The hazard did not show on this run: with the requests as hard limits "
            f"({plan}) an iteration took {pace_l:.2f} s against {pace_r:.2f} s with "
            f"requests only ({h.limits.throttled} throttled periods). Other work on the "
            "machine held both runs to about their requests (a request is a weight: under "
            "contention a rank gets about its share either way); where cores are idle, a "
            "limit forbids using them and a throttled rank stalls the others."
        )
    if slow is not None:
        return (
            f"Hazard avoided: the same requests as hard CPU limits ({plan}) made each "
            f"iteration "
            f"{'at least ' if h.at_least else ''}{slow:.1f}x slower ({pace_l:.2f} s "
            f"against {pace_r:.2f} s) with {h.limits.throttled} throttled periods; a "
            "throttled rank holds every other rank at the next collective. rankpack sets "
            "requests (weights), never limits."
        )
    return "Hazard: the runs were too short to time an iteration; see the report."


def _limit_line(w: Workload, r: RanksStep, computing_cores: float, p: Payoff | None) -> str:
    share = ""
    if (
        p is not None
        and p.gain
        and p.limit
        and p.max_concurrent_seen >= 2
        and p.limit > 1.0001
        and p.gain <= 1.05 * p.limit
    ):
        share = (
            f"; measured {p.gain:.2f}x is {max(0.0, p.gain - 1) / (p.limit - 1):.0%} of "
            "the possible gain"
        )
    limit = p.limit if p is not None and p.limit else r.limit_of_two
    return (
        f"This machine's limit: {w.cores:g} cores; one simulation alone computes on "
        f"{computing_cores:.2f} of them, so two together can gain at most "
        f"{limit or 0:.2f}x (no number of simulations beats {w.cores:g} / "
        f"{computing_cores:.2f}){share}."
    )


def _payoff_cautions(p: Payoff) -> list[str]:
    out: list[str] = []
    apart = effects(p.session)
    if apart:
        out.append("Not in the gain (not co-location's doing): " + "; ".join(apart) + ".")
    if p.gain and p.limit and p.gain > 1.05 * p.limit:
        out.append(
            f"Caution: the measured {p.gain:.2f}x exceeds the physical limit {p.limit:.2f}x, "
            "which no co-location can do: other work on this machine slowed the single run "
            "(spinning ranks lose most when other processes share the cores) or changed "
            "between the single run and the session, so this gain is not sound; run the demo "
            "again when the machine is quiet."
        )
    if p.max_concurrent_seen >= 2 and p.gain is not None and p.gain < 1.02:
        held = f" The launch gate said: {p.held[-1]}." if p.held else ""
        out.append(
            "Why no gain: the co-located simulations slowed each other more than the "
            f"idle CPU gave back ({p.resizes} resizes, {p.wait_switches} wait-mode "
            f"switches).{held}"
        )
    return out


def _load_line(load: float | None, cores: float) -> str:
    busy = load is not None and load > 0.5 * cores
    line = ("The machine was busy: " if busy else "") + (
        f"measured once, on this machine as it was (load average {load:.1f} on "
        f"{cores:g} cores when the demo started): other work running at the same time "
        "slows every step and shifts duty cycles, so the numbers move from run to run."
        if load is not None
        else "measured once, on this machine as it was."
    )
    return line[0].upper() + line[1:]


# -- terminal tables ------------------------------------------------------------------------


def _f(v: float | None, fmt: str = ".2f", unit: str = "") -> str:
    return "-" if v is None else f"{v:{fmt}}{unit}"


def hazard_table(h: Hazard) -> Table:
    t = Table(
        title=f"1. The hazard: the same plan ({'/'.join(f'{m}m' for m in h.plan_millis)}) as "
        "hard limits vs requests only",
        caption=f"each run bounded by {h.iterations_bound} iterations and "
        f"{h.time_bound_s:.0f} s; per iteration: steady, start-up left out",
    )
    for col in ("QoS", "run", "status", "iterations", "wall s", "s / iteration", "throttled"):
        t.add_column(col, justify="left" if col in ("QoS", "status") else "right")
    for run in (h.requests, h.limits):
        status = f"stopped at {h.time_bound_s:.0f} s" if run.stopped_at_bound else run.status
        pace = run.pace.seconds_per_iteration
        t.add_row(
            run.qos, str(run.run_id), status, str(run.iterations), f"{run.wall_s:.1f}",
            (">" if run.pace.lower_bound else "") + _f(pace, ".3f"), str(run.throttled),
        )  # fmt: skip
    return t


def ranks_table(r: RanksStep) -> Table:
    t = Table(
        title=f"2. What each rank really does (run {r.run_id}, {r.wall_s:.1f} s, "
        f"{len(r.completed_resizes)} in-place resizes, {r.restarts} restarts)",
        caption=f"waiting in MPI: {_f(r.waiting_cores)} cores of {r.capacity_cores:g}; "
        f"computing: {_f(r.computing_cores)} cores -> two simulations can gain at most "
        f"{_f(r.limit_of_two)}x",
    )
    for col in ("rank", "cells", "duty", "CPU cores", "computing", "waiting", "request"):
        t.add_column(col, justify="right")
    for w in r.work:
        t.add_row(
            str(w.rank), str(w.cells or "-"), _f(None if w.duty is None else 100 * w.duty, ".0f",
                                                 " %"),
            _f(w.cpu_cores), _f(w.computing_cores), _f(w.waiting_cores),
            f"{w.request_first}m -> {w.request_last}m",
        )  # fmt: skip
    return t


def payoff_table(p: Payoff) -> Table:
    t = Table(
        title=f"3. The payoff: two queued simulations, multiplexed (session {p.multiplex_id}) vs "
        "one after the other",
        caption=f"one after another: single runs that started as these did ({p.baseline}); "
        "together: while either ran; limit: work-conserving bound from the single runs' duty "
        "cycles",
    )
    for col in ("sequential s", "together s", "gain", "limit", "at once", "resizes",
                "wait switches"):  # fmt: skip
        t.add_column(col, justify="right")
    t.add_row(
        _f(p.sequential_s, ".1f"), f"{p.together_s:.1f}", _f(p.gain, ".2f", "x"),
        _f(p.limit, ".2f", "x"), str(p.max_concurrent_seen), str(p.resizes),
        str(p.wait_switches),
    )  # fmt: skip
    return t


def tables(story: Story) -> list[Table]:
    out = []
    if story.hazard is not None:
        out.append(hazard_table(story.hazard))
    if story.ranks is not None:
        out.append(ranks_table(story.ranks))
    if story.payoff is not None:
        out.append(payoff_table(story.payoff))
    return out


def to_json(story: Story) -> dict[str, Any]:
    def pace(p: IterationPace) -> dict[str, Any]:
        return asdict(p)

    data: dict[str, Any] = {
        "workload": asdict(story.workload),
        "machine": {"cores": story.workload.cores, "load_average_start": story.load_start,
                    "load_average_end": story.load_end},
        "interrupted": story.interrupted,
        "failed": story.failed,
        "summary": {"headline": headline(story), "lines": summary_lines(story)},
        "report_html": story.report_html,
    }  # fmt: skip
    if story.hazard is not None:
        h = story.hazard
        data["hazard"] = {
            "plan_millis": list(h.plan_millis),
            "iterations_bound": h.iterations_bound,
            "time_bound_s": h.time_bound_s,
            "slowdown": h.slowdown,
            "slowdown_is_lower_bound": h.at_least,
            "runs": {
                run.qos: {**{k: v for k, v in asdict(run).items() if k != "pace"},
                          "pace": pace(run.pace)}
                for run in (h.requests, h.limits)
            },
        }  # fmt: skip
    if story.ranks is not None:
        r = story.ranks
        data["ranks"] = {
            "run_id": r.run_id,
            "status": r.status,
            "wall_s": r.wall_s,
            "restarts": r.restarts,
            "waiting_cores": r.waiting_cores,
            "computing_cores": r.computing_cores,
            "limit_of_two": r.limit_of_two,
            "ranks": [
                {**asdict(w), "computing_cores": w.computing_cores,
                 "waiting_cores": w.waiting_cores}
                for w in r.work
            ],
            "resizes": [z.to_json() for z in r.resizes],
        }  # fmt: skip
    if story.payoff is not None:
        p = story.payoff
        data["payoff"] = {k: v for k, v in asdict(p).items() if k != "session"}
        data["payoff"]["session"] = p.session
    return data
