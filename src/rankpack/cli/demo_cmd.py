"""`rankpack demo`: what rankpack is for, measured on this machine in three steps.

The workload resembles a user's: pitzDaily with its block cell counts doubled in x and y
(48 900 cells), 2 ranks whose subdomains hold 1/4 and 3/4 of the cells, and two copies of
it to run on a machine whose cores they share (each simulation's requests are half the
machine). The steps, each measured side by side:

1. the hazard: the plan each simulation would get (requests proportional to the cells) as
   hard CPU limits versus requests only, each run bounded by iterations and time;
2. what each rank really does: one run with one request per rank, profiled live by the
   PMPI shim and resized in place to its duty cycles;
3. the payoff: two copies queued and run by `rankpack multiplex`'s own code path with its
   defaults, against running them one after the other (the run of step 2 is that baseline),
   with the physical limit of the gain beside it.

A closing summary says what was gained and why, and where this machine's limits are; an
HTML report of every run and of the session is written and its path printed. By default the
demo records into a new database of its own (so earlier runs teach it nothing and its queue
is its own); `--db` or RANKPACK_DB chooses one.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.panel import Panel

from rankpack.backend.local import LocalBackend
from rankpack.case.openfoam import n_cells, resolve_case
from rankpack.case.refine import MAX_REFINE, check_refinable, refined_case
from rankpack.cli.common import (
    data_dir,
    db_path,
    parse_iterations,
    parse_list,
    parse_ranks,
    parse_refine,
    parse_report_file,
    print_json,
)
from rankpack.cli.multiplex_cmd import MultiplexOptions, run_multiplex
from rankpack.cli.run_cmd import check_submission, run_one, stop_on_signals
from rankpack.controller.views import Display, SimView
from rankpack.core.results import RunResult
from rankpack.errors import UserError
from rankpack.plan.allocation import make_plan, resolve_weights
from rankpack.plan.submission import Submission
from rankpack.report.build import Part, build_report, write_report
from rankpack.report.data import iteration_pace, load_run, rank_work
from rankpack.report.live import RunDisplay
from rankpack.report.story import (
    Hazard,
    HazardRun,
    Payoff,
    RanksStep,
    Story,
    Workload,
    headline,
    held_reasons,
    summary_lines,
    tables,
    to_json,
)
from rankpack.store import Store


@dataclass(frozen=True)
class Sizes:
    """How long each step runs (full demo or --quick)."""

    iterations: int
    """Of the runs of steps 2 and 3 (each simulation's length)."""
    hazard_iterations: int
    hazard_time_s: float
    """Each run of step 1 is stopped here if it has not finished its iterations."""


FULL = Sizes(iterations=300, hazard_iterations=30, hazard_time_s=45.0)
QUICK = Sizes(iterations=100, hazard_iterations=10, hazard_time_s=15.0)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo",
        help="what rankpack is for, measured here: the limits hazard, duty cycles, the "
        "co-location gain",
        description=(
            "Run a real OpenFOAM workload on this machine in three measured steps: (1) the "
            "hazard: the same plan as hard CPU limits vs requests only (bounded by iterations "
            "and time); (2) what each rank really does: live duty cycles, the CPU spent "
            "waiting, in-place resizes; (3) the payoff: two queued simulations multiplexed "
            "(rankpack multiplex, defaults) vs one after the other, with the physical limit. "
            "Ends with a summary and the path of an HTML report. A few minutes; --quick: about "
            "one. Records into a new database of its own (beside the report) unless --db or "
            "RANKPACK_DB names one."
        ),
    )
    p.add_argument("--quick", action="store_true", help="shorter runs (about one minute)")
    p.add_argument("--case", default="pitzDaily", help="tutorial or case directory (pitzDaily)")
    p.add_argument(
        "--refine",
        type=parse_refine,
        default=2,
        help=f"multiply the blockMesh cell counts in x and y by this (1-{MAX_REFINE}; default "
        "2: pitzDaily 48 900 cells)",
    )
    p.add_argument(
        "--weights",
        type=parse_list,
        default="1,3",
        help="how the cells are split between the ranks (default 1,3: two ranks, 1/4 and 3/4)",
    )
    p.add_argument("--ranks", type=parse_ranks, help="number of ranks (default: one per weight)")
    p.add_argument(
        "--iterations",
        type=parse_iterations,
        help=f"iterations of each simulation in steps 2-3 (default {FULL.iterations}, "
        f"--quick {QUICK.iterations})",
    )
    p.add_argument(
        "--output",
        "-o",
        type=parse_report_file,
        help="the HTML report (default: report.html in a new directory under <data dir>/demos)",
    )
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.set_defaults(handler=handle)


class Bounded:
    """A display that stops its run when the user stops the demo or at a time bound."""

    def __init__(self, inner: Display | None, user_stop: threading.Event, seconds: float):
        self.inner = inner
        self.user_stop = user_stop
        self.seconds = seconds
        self.stop = threading.Event()
        self.hit = False

    def update(self, now_s: float, sims: Sequence[SimView]) -> None:
        if self.inner is not None:
            self.inner.update(now_s, sims)
        if self.user_stop.is_set():
            self.stop.set()
        elif any(s.run_id is not None and s.elapsed_s >= self.seconds for s in sims):
            self.hit = True
            self.stop.set()

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def handle(args: argparse.Namespace) -> int:
    sizes = QUICK if args.quick else FULL
    if args.iterations is not None:
        sizes = replace(sizes, iterations=args.iterations)
    weights = resolve_weights(args.weights, args.ranks, False)
    # Everything that can be refused is checked before anything is created.
    source_case = resolve_case(args.case)
    check_refinable(source_case.path, args.refine)
    explicit_db = bool(getattr(args, "db", None) or os.environ.get("RANKPACK_DB"))
    given_db = db_path(args) if explicit_db else None
    root = data_dir()
    backend = LocalBackend()
    capacity = backend.inventory().allocatable_millis
    budget = max(capacity // 2, 10 * len(weights))
    make_plan(weights, budget)
    existing = Store.open_existing(given_db) if given_db is not None else None
    if existing is not None:
        waiting = len(existing.queue())
        existing.close()
        if waiting:
            raise UserError(
                f"the queue of {given_db} has {waiting} waiting simulations, which the demo's "
                "multiplex step would run too; run or cancel them (`rankpack queue`), or run "
                "the demo without --db / RANKPACK_DB (it then uses its own database)"
            )
    say = Console(stderr=True, quiet=args.json)
    case = args.case
    if args.refine > 1:
        say.print(f"preparing the workload: {args.case} refined x{args.refine} ...")
        case = str(refined_case(args.case, args.refine, root / "cases"))
    source = resolve_case(case)
    workload = Workload(
        case=source.name, source=args.case, refine=args.refine,
        cells=_cells(source.path), cell_weights=tuple(weights), iterations=sizes.iterations,
        budget_millis=budget, capacity_millis=capacity,
    )  # fmt: skip
    n = len(weights)
    hazard_sub = Submission(case, tuple(weights), budget, iterations=sizes.hazard_iterations,
                            decompose="weighted", sizing="fixed")  # fmt: skip
    main_sub = Submission(case, (1.0,) * n, budget, iterations=sizes.iterations,
                          decompose="weighted", decompose_weights=tuple(weights),
                          sizing="duty")  # fmt: skip
    for sub in (hazard_sub, main_sub):
        check_submission(sub)
    out_dir = _new_dir(root / "demos")
    store = Store(given_db or out_dir / "rankpack.db")
    report_path: Path = args.output or out_dir / "report.html"
    story = Story(workload, load_start=os.getloadavg()[0])
    shares = "/".join(f"{w / sum(weights):.0%}" for w in weights)
    say.print(
        f"[bold]rankpack demo[/]: {workload.case} ({workload.cells} cells), {n} ranks holding "
        f"{shares} of the cells, two such simulations on {capacity / 1000:g} cores; records "
        f"in {store.path}"
    )
    with stop_on_signals() as stop:
        try:
            story = _steps(story, store, backend, hazard_sub, main_sub, sizes, stop, say)
        except KeyboardInterrupt:
            story = replace(story, interrupted=True)
        story = replace(story, interrupted=story.interrupted or stop.is_set(),
                        load_end=os.getloadavg()[0])  # fmt: skip
    story = _report(story, store, report_path, say)
    if args.json:
        print_json(to_json(story))
    else:
        console = Console()
        for table in tables(story):
            console.print(table)
        text = "\n".join(f"- {line}" for line in summary_lines(story))
        console.print(Panel(f"[bold]{headline(story)}[/]\n\n{text}", title="what was measured"))
        if story.report_html:
            console.print(f"report: {story.report_html}")
    if story.interrupted:
        print("rankpack: demo interrupted; the story is incomplete (only finished steps are "
              "shown)", file=sys.stderr)  # fmt: skip
        return 130
    done = story.payoff is not None and story.payoff.status == "completed"
    return 0 if done else 1


def _steps(
    story: Story, store: Store, backend: LocalBackend, hazard_sub: Submission,
    main_sub: Submission, sizes: Sizes, stop: threading.Event, say: Console,
) -> Story:  # fmt: skip
    plan = tuple(r.cpu_millis for r in hazard_sub.plan().ranks)
    say.print(
        f"\n[bold]1/3 the hazard[/]: requests {'/'.join(f'{m}m' for m in plan)} as hard limits, "
        f"then as requests only ({sizes.hazard_iterations} iterations or "
        f"{sizes.hazard_time_s:.0f} s each)"
    )
    limited = _hazard_run(replace(hazard_sub, qos="limits"), store, backend, sizes, stop, say)
    requests = _hazard_run(hazard_sub, store, backend, sizes, stop, say)
    story = replace(story, hazard=Hazard(plan, sizes.hazard_iterations, sizes.hazard_time_s,
                                         requests, limited))  # fmt: skip
    say.print(
        f"\n[bold]2/3 what each rank really does[/]: one request per rank "
        f"({'/'.join(f'{r.cpu_millis}m' for r in main_sub.plan().ranks)}), profiled live and "
        "resized in place to the measured duty cycles"
    )
    result = run_one(main_sub, backend, store, show=not say.quiet, stop=stop, label="demo-ranks")
    if stop.is_set() or result.status == "interrupted":
        raise KeyboardInterrupt
    data = load_run(store, result.id)
    story = replace(story, ranks=RanksStep(
        result.id, result.status, result.wall_s, tuple(rank_work(data)), result.resizes,
        result.restarts, story.workload.cores))  # fmt: skip
    if result.status != "completed":
        return replace(story, failed=f"the run of step 2 (run {result.id}) {result.status}: "
                                     f"{result.message}")  # fmt: skip
    say.print(
        "\n[bold]3/3 the payoff[/]: two copies queued; `rankpack multiplex` (defaults) runs "
        "them, against one after the other"
    )
    store.submit_many(main_sub.case, main_sub.n_ranks, main_sub.to_json(), 2)
    outcome = run_multiplex(store, backend, MultiplexOptions(), show=not say.quiet, stop=stop)
    if outcome is None:
        raise KeyboardInterrupt
    res = outcome.result
    events = store.events(multiplex_id=res.multiplex_id)
    payoff = Payoff(
        multiplex_id=res.multiplex_id, status=res.status, gain=res.throughput_gain,
        limit=res.throughput_limit, makespan_s=res.makespan_s, sequential_s=res.sequential_s,
        baseline=res.baseline_source, max_concurrent_seen=res.max_concurrent_seen,
        resizes=res.resizes, restarts=res.restarts,
        wait_switches=sum(1 for e in events if e.kind == "wait-mode"),
        held=held_reasons(events),
        timeline_png=str(outcome.timeline_png), session=outcome.to_json(), busy_s=res.busy_s,
    )  # fmt: skip
    return replace(story, payoff=payoff, interrupted=res.status == "interrupted")


def _hazard_run(
    sub: Submission, store: Store, backend: LocalBackend, sizes: Sizes,
    stop: threading.Event, say: Console,
) -> HazardRun:  # fmt: skip
    # Without the shim: MPI's own waiting, as a user's job runs today (and the demo's later
    # steps learn nothing from these runs: learned sizes need duty cycles).
    inner = None if say.quiet else RunDisplay(f"{Path(sub.case).name}, {sub.qos}")
    bound = Bounded(inner, stop, sizes.hazard_time_s)
    result: RunResult = run_one(sub, backend, store, show=False, stop=bound.stop, shim=False,
                                label=f"demo-hazard-{sub.qos}", display=bound)  # fmt: skip
    if stop.is_set():
        raise KeyboardInterrupt
    if bound.hit:
        store.set_run_message(
            result.id, f"stopped by rankpack demo at its {sizes.hazard_time_s:.0f} s bound"
        )
    data = load_run(store, result.id)
    return HazardRun(
        qos=sub.qos, run_id=result.id, status=result.status, stopped_at_bound=bound.hit,
        iterations=result.iterations, wall_s=result.wall_s,
        pace=iteration_pace(data.progress, result.wall_s),
        throttled=sum(r.nr_throttled for r in result.ranks),
        throttled_s=sum(r.throttled_s for r in result.ranks),
    )  # fmt: skip


def _report(story: Story, store: Store, path: Path, say: Console) -> Story:
    parts = []
    if story.hazard is not None:
        parts += [
            Part(run_id=story.hazard.limits.run_id,
                 title=f"1. The hazard: hard limits (run {story.hazard.limits.run_id})"),
            Part(run_id=story.hazard.requests.run_id,
                 title=f"1. The hazard: requests only (run {story.hazard.requests.run_id})"),
        ]  # fmt: skip
    if story.ranks is not None:
        rid = story.ranks.run_id
        parts.append(Part(run_id=rid, title=f"2. What each rank really does (run {rid})"))
    if story.payoff is not None:
        mid = story.payoff.multiplex_id
        parts.append(Part(multiplex_id=mid, title=f"3. The payoff: multiplex session {mid}"))
    if not parts:
        return story
    doc = build_report(
        store, parts, title=f"rankpack demo: {story.workload.case}",
        headline=headline(story), summary=summary_lines(story),
    )  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    written = write_report(doc, path)
    say.print(f"report written: {written.html} (figures also as PNG in {written.png_dir}/)")
    return replace(story, report_html=str(written.html))


def _new_dir(root: Path) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = root / f"demo-{stamp}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    path.mkdir(parents=True)
    return path


def _cells(case_dir: Path) -> int | None:
    try:
        return n_cells(case_dir)
    except (OSError, UserError):
        return None
