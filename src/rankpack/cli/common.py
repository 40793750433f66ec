"""Helpers shared by sub-commands: option parsing of units, JSON output, the database path."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rankpack.controller.observations import Phase
from rankpack.errors import UserError


def parse_millis(text: str) -> int:
    """'250m' or '250' -> 250 millicores; a bare number with a dot ('0.5') is cores."""
    raw = text.strip().lower()
    try:
        if raw.endswith("m"):
            value = float(raw[:-1])
        elif "." in raw:
            value = float(raw) * 1000
        else:
            value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a CPU amount; use millicores like 250m"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is negative; CPU amounts must be >= 0")
    return round(value)


def parse_cores(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a number of cores, e.g. 4 or 2.5"
        ) from None
    return value


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def db_path(args: argparse.Namespace) -> Path:
    """--db, else $RANKPACK_DB, else <user data dir>/rankpack.db."""
    explicit = getattr(args, "db", None) or os.environ.get("RANKPACK_DB")
    if explicit:
        path = Path(explicit).expanduser()
        if path.exists() and path.is_dir():
            raise UserError(f"database path {path} is a directory; give a file path for --db")
        return path
    from platformdirs import user_data_dir

    return Path(user_data_dir("rankpack")) / "rankpack.db"


def data_dir() -> Path:
    """Where run directories go by default ($RANKPACK_HOME or the user data directory)."""
    explicit = os.environ.get("RANKPACK_HOME")
    if explicit:
        return Path(explicit).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("rankpack"))


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
