"""Helpers shared by sub-commands: argparse ``type=`` validators, JSON output, the database
path and the data directory.

Every ``parse_*`` below is a thin wrapper of `rankpack.quantities` / `rankpack.paths`: it
turns their `InvalidQuantity` into argparse's error, which `OneLineArgumentParser` prints
as one line naming the flag (exit 2). Nothing is created by a check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from rankpack import paths, quantities
from rankpack.errors import UserError
from rankpack.plan.submission import Phase
from rankpack.quantities import InvalidQuantity

T = TypeVar("T")

SELF = "\x1f"
"""Stands for the option's own name in a validator's message; the parser puts the flag there."""


def _argparse_type(check: Callable[[str], T], name: str) -> Callable[[str], T]:
    def parse(text: str) -> T:
        try:
            return check(text)
        except InvalidQuantity as exc:
            raise argparse.ArgumentTypeError(exc.render(lambda _: SELF)) from None

    parse.__name__ = name
    return parse


# Counts
parse_ranks = _argparse_type(lambda t: quantities.ranks(t, "x"), "ranks")
parse_iterations = _argparse_type(lambda t: quantities.iterations(t, "x"), "iterations")
parse_submit_count = _argparse_type(
    lambda t: quantities.count(t, "x", hi=quantities.MAX_SUBMIT_COUNT), "count"
)
parse_repeat = _argparse_type(
    lambda t: quantities.count(t, "x", hi=quantities.MAX_REPEAT), "repeat"
)
parse_concurrent = _argparse_type(
    lambda t: quantities.count(t, "x", hi=quantities.MAX_CONCURRENT), "max_concurrent"
)
parse_simulations = _argparse_type(
    lambda t: quantities.count(t, "x", hi=quantities.MAX_SIMULATIONS), "simulations"
)
parse_refine = _argparse_type(lambda t: quantities.count(t, "x", hi=8), "refine")
"""A mesh refinement factor, 1-8 (`rankpack demo --refine`)."""
parse_nodes = _argparse_type(lambda t: quantities.count(t, "x", hi=quantities.MAX_NODES), "nodes")
parse_limit = _argparse_type(lambda t: quantities.count(t, "x", hi=1_000_000), "limit")
parse_id = _argparse_type(lambda t: quantities.record_id(t, "x"), "id")
parse_mib_pair = _argparse_type(lambda t: quantities.mib_pair(t, "x"), "MiB pair")
"""``REQUEST,LIMIT`` in MiB: '256,4096' -> (256, 4096)."""

# CPU: Kubernetes quantities ('2', '1.5', '500m') everywhere
parse_millis = _argparse_type(lambda t: quantities.cpu_millis(t, "x"), "millicores")
"""A CPU amount in millicores: '500m' -> 500, '2' -> 2000, '1.5' -> 1500 (Kubernetes forms)."""
parse_positive_millis = _argparse_type(lambda t: quantities.cpu_millis(t, "x", lo=1), "millicores")
parse_cores = _argparse_type(lambda t: quantities.cpu_cores(t, "x"), "cores")
"""A positive CPU amount in cores: '4' -> 4.0, '2.5' -> 2.5, '500m' -> 0.5."""
parse_cpus_per_node = _argparse_type(
    lambda t: quantities.real(
        t, "x", lo=0.0, hi=quantities.MAX_CPUS_PER_NODE, lo_open=True, what="a number of vCPUs"
    ),
    "cpus",
)

# Durations, fractions, prices, coefficients
parse_seconds = _argparse_type(lambda t: quantities.seconds(t, "x"), "seconds")
parse_fraction = _argparse_type(lambda t: quantities.fraction(t, "x"), "fraction")
parse_skip = _argparse_type(lambda t: quantities.fraction(t, "x", hi_open=True), "fraction")
parse_price = _argparse_type(lambda t: quantities.price(t, "x"), "price")
parse_coefficient = _argparse_type(lambda t: quantities.coefficient(t, "x"), "coefficient")
parse_positive_coefficient = _argparse_type(
    lambda t: quantities.coefficient(t, "x", positive=True), "coefficient"
)

# Paths (checked, never created)
parse_output_file = _argparse_type(lambda t: paths.plot_file(t, "x"), "file")
"""An image to write (a plot): not a directory, its directory exists and is writable, its
suffix a format matplotlib writes."""
parse_report_file = _argparse_type(lambda t: paths.report_file(t, "x"), "file")
"""An HTML report to write (its directory exists and is writable; its figures go beside it)."""
parse_output_dir = _argparse_type(lambda t: paths.output_dir(t, "x"), "directory")
"""A directory to write into (plot or trace directory), created if missing."""
parse_workdir = _argparse_type(lambda t: paths.output_dir(t, "x", must_be_empty=True), "workdir")
"""A run's working directory: new or empty, on a writable disk."""
parse_new_dir = _argparse_type(lambda t: paths.new_dir(t, "x"), "directory")
"""A directory to create (it must not exist; its parent must)."""
parse_list = _argparse_type(lambda t: quantities.list_text(t, "x"), "list")
"""A list-valued option (weights, duty cycles): not empty, at most MAX_TEXT characters."""
parse_db = _argparse_type(lambda t: paths.database_file(t, "x"), "database")
"""The database file: not a directory, on a writable disk (its directory may be created),
an SQLite file if it exists and is not empty."""
parse_path_text = _argparse_type(lambda t: quantities.path_text(t, "x"), "path")


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def print_listing(
    as_json: bool,
    data: Sequence[Any],
    empty: str,
    title: str,
    columns: Sequence[str],
    rows: Callable[[], Iterable[Sequence[str]]],
    right: Collection[str] = (),
) -> int:
    """A listing sub-command's output: ``data`` as JSON with ``--json``; else ``empty`` (what
    to do to get some) if there is nothing, else a table of ``rows()``. The first column (the
    name or id a user types next) is never wrapped or cut, however narrow the terminal.
    Returns exit code 0."""
    from rich.console import Console
    from rich.table import Table

    if as_json:
        print_json(data)
    elif not data:
        Console().print(empty)
    else:
        cells = [list(r) for r in rows()]
        table = Table(title=title)
        for i, col in enumerate(columns):
            justify: Literal["left", "right"] = "right" if col in right else "left"
            if i == 0:
                widest = max([len(col), *(len(r[0]) for r in cells)])
                table.add_column(col, justify=justify, no_wrap=True, min_width=widest)
            else:
                table.add_column(col, justify=justify)
        for row in cells:
            table.add_row(*row)
        Console().print(table)
    return 0


def db_path(args: argparse.Namespace) -> Path:
    """--db, else $RANKPACK_DB, else <user data dir>/rankpack.db; checked (not created)."""
    explicit = getattr(args, "db", None) or os.environ.get("RANKPACK_DB")
    if explicit:
        name = "db" if getattr(args, "db", None) else "RANKPACK_DB"
        return _database_file(explicit, name)
    from platformdirs import user_data_dir

    return _database_file(str(Path(user_data_dir("rankpack")) / "rankpack.db"), "database")


def _database_file(given: str | os.PathLike[str], name: str) -> Path:
    text = os.fspath(given)
    path = Path(text).expanduser()
    quantities.path_text(text, name)
    if path.is_dir():
        raise InvalidQuantity(
            f"{{{name}}} {quantities.literal(str(path), 80)} is a directory; give a file path"
        )
    paths.database_file(str(path), name)
    return path


def data_dir() -> Path:
    """Where run directories go by default ($RANKPACK_HOME or the user data directory);
    checked (a file, a read-only or kernel filesystem are refused), not created."""
    explicit = os.environ.get("RANKPACK_HOME")
    if explicit:
        paths.output_dir(explicit, "RANKPACK_HOME")
        return Path(explicit).expanduser()
    from platformdirs import user_data_dir

    path = Path(user_data_dir("rankpack"))
    paths.output_dir(str(path), "data_directory")
    return path


def phases_from_text(text: str, n_ranks: int) -> tuple[Phase, ...]:
    """``0:500,500,1200,1800;0.34:1000,1000,1000,1000`` -> phases (fraction: per-rank millis)."""
    phases: list[Phase] = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        try:
            frac_text, millis_text = part.split(":", 1)
            frac = float(frac_text)
            millis = tuple(int(x.strip().rstrip("m")) for x in millis_text.split(","))
        except ValueError:
            raise UserError(
                f"phase '{part}' must look like 0.34:1000,1000,1000,1000 "
                "(fraction:per-rank millicores)"
            ) from None
        if not 0 <= frac < 1:
            raise UserError(f"phase start {frac:g} must be in [0, 1)")
        if len(millis) != n_ranks:
            raise UserError(f"phase '{part}' has {len(millis)} requests for {n_ranks} ranks")
        if any(m < 1 for m in millis):
            raise UserError(f"phase '{part}' has a request below 1 millicore")
        if phases and frac <= phases[-1].start_fraction:
            raise UserError("phases must be given in increasing order of their start fraction")
        phases.append(Phase(frac, millis))
    if not phases:
        raise UserError("--phases is empty; give e.g. 0:500,500,1200,1800;0.5:1000,1000,1000,1000")
    return tuple(phases)
