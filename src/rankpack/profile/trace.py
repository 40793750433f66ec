"""Reads the shim's trace CSVs (``rank,function,enter_us,exit_us``, one file per rank and run:
``rank-R.csv``, then ``rank-R.1.csv``, ... never overwritten). Used for wait-time
distributions and per-iteration duty cycles."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from rankpack.profile.duty import CallEvent


def read_trace(path: Path) -> Iterator[CallEvent]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != ["rank", "function", "enter_us", "exit_us"]:
            raise ValueError(f"{path} is not a rankpack trace (header {reader.fieldnames})")
        for row in reader:
            yield CallEvent(
                int(row["rank"]), row["function"], float(row["enter_us"]), float(row["exit_us"])
            )
