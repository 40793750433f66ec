"""One validation layer for every quantity a user can give rankpack.

Called by the CLI's argparse ``type=`` functions (`rankpack.cli.common`) and by the pure
layers (`plan/`, `model/`) for values that arrive as numbers. Pure: no I/O, no CLI imports.

Every function parses (when given text) and bounds a value, and raises `InvalidQuantity`
whose message says what is wrong and what is accepted. Values are finite (no NaN/inf) and
bounded by what one machine or one cluster can hold, so that no later arithmetic overflows,
no list grows to gigabytes and no model search runs for minutes. The bounds are the
``MAX_*`` constants below; docs/reliability.md lists them.

Messages name a quantity by a placeholder such as ``{ranks}``. The pure layers never know
the command-line flag; `InvalidQuantity.render` lets the CLI substitute ``--ranks`` while
``str(exc)`` reads ``ranks``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from rankpack.errors import UserError

MAX_RANKS = 4096
"""MPI ranks per simulation (also the longest weight or duty-cycle list)."""
MAX_ITERATIONS = 10_000_000
"""Time steps of one run."""
MAX_SUBMIT_COUNT = 1000
"""Copies queued by one `rankpack submit`."""
MAX_REPEAT = 100
"""Repetitions of one `rankpack demo` configuration."""
MAX_CONCURRENT = 256
"""Simulations one multiplex session runs at once."""
MAX_CORES = 100_000
"""Largest CPU amount (budget, quota, request) in cores: a large cluster, not a node."""
MAX_MILLIS = MAX_CORES * 1000
MAX_NODES = 100_000
"""Nodes of a modelled cluster."""
MAX_CPUS_PER_NODE = 1024
"""Allocatable vCPUs of one modelled node."""
MAX_SIMULATIONS = 1000
"""Largest number of co-located simulations N a model fits, predicts or plans."""
MAX_SECONDS = 366 * 24 * 3600.0
"""Durations (makespans, profiling windows): a year."""
MAX_PRICE = 1_000_000.0
"""Price per node-hour (any currency)."""
MAX_COEFFICIENT = 1_000_000.0
"""Model coefficients such as beta or memory streams."""
MAX_ID = 2**63 - 1
"""Database ids are SQLite integers."""
MAX_TEXT = 100_000
"""Longest text a list-valued option is parsed from (weights, duty cycles, points)."""
PATH_MAX = 4096
NAME_MAX = 255

_INT = re.compile(r"^[+-]?[0-9]+$")
_REAL = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")
_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]*)\}")


class InvalidQuantity(UserError, ValueError):
    """A value out of its accepted form or range.

    ``template`` names quantities as ``{name}`` placeholders (e.g. ``{ranks}``);
    `render` fills them in (the CLI with flags), ``str()`` with the plain names.
    """

    def __init__(self, template: str) -> None:
        self.template = template
        self.names = tuple(dict.fromkeys(_PLACEHOLDER.findall(template)))
        super().__init__(self.render(lambda name: name.replace("_", " ")))

    def render(self, label: Callable[[str], str]) -> str:
        return _PLACEHOLDER.sub(lambda m: label(m.group(1)), self.template)


def literal(text: str, limit: int = 40) -> str:
    """User text quoted for a message: shortened, no braces or control characters."""
    clean = "".join(c if c.isprintable() and c not in "{}" else "?" for c in text)
    if len(clean) > limit:
        clean = clean[: limit - 3] + "..."
    return f"'{clean}'"


def _show(value: object) -> str:
    if isinstance(value, str):
        return literal(value)
    if isinstance(value, float):
        return f"{value:g}"
    return literal(str(value))


def parse_int(value: int | str, name: str, *, what: str = "a whole number") -> int:
    """An integer from an int or ASCII decimal text (no '1_000', '1e3' or '1.0')."""
    if isinstance(value, bool):
        raise InvalidQuantity(f"{{{name}}} must be {what}, got {value!r}")
    if isinstance(value, int):
        return value
    text = value.strip()
    if len(text) > 30 or not _INT.match(text):
        raise InvalidQuantity(f"{{{name}}} must be {what} such as 4, got {_show(value)}")
    return int(text)


def parse_real(value: float | int | str, name: str, *, what: str = "a number") -> float:
    """A finite float from a number or decimal text ('2', '1.5', '1e-3'; not nan/inf)."""
    if isinstance(value, bool):
        raise InvalidQuantity(f"{{{name}}} must be {what}, got {value!r}")
    if isinstance(value, int | float):
        out = float(value) if abs(value) < 1e308 or isinstance(value, float) else math.inf
    else:
        text = value.strip()
        if len(text) > 40 or not _REAL.match(text):
            raise InvalidQuantity(f"{{{name}}} must be {what} such as 2 or 1.5, got {_show(value)}")
        out = float(text)
    if not math.isfinite(out):
        raise InvalidQuantity(f"{{{name}}} must be a finite number, got {_show(value)}")
    return out


def count(value: int | str, name: str, *, lo: int = 1, hi: int) -> int:
    """A whole number in [lo, hi]."""
    n = parse_int(value, name)
    if n < lo or n > hi:
        raise InvalidQuantity(f"{{{name}}} must be at least {lo} and at most {hi}, got {n}")
    return n


MAX_MIB = 1 << 20
"""The most memory or ephemeral storage a pod bound names, MiB (1 TiB)."""


def mib_pair(value: str, name: str) -> tuple[int, int]:
    """``REQUEST,LIMIT`` in MiB, each 1..`MAX_MIB`, the request at most the limit."""
    parts = str(value).split(",")
    if len(parts) != 2:
        raise InvalidQuantity(f"{{{name}}} must be REQUEST,LIMIT in MiB (e.g. 256,4096), "
                              f"got {str(value)[:40]!r}")  # fmt: skip
    req, lim = (count(p.strip(), name, hi=MAX_MIB) for p in parts)
    if req > lim:
        raise InvalidQuantity(f"{{{name}}}: the request {req} MiB is above the limit {lim} MiB")
    return req, lim


def ranks(value: int | str, name: str = "ranks") -> int:
    """MPI ranks of one simulation: 1..MAX_RANKS (the case's cells are checked later)."""
    return count(value, name, lo=1, hi=MAX_RANKS)


def iterations(value: int | str, name: str = "iterations") -> int:
    """Time steps: 1..MAX_ITERATIONS."""
    return count(value, name, lo=1, hi=MAX_ITERATIONS)


def record_id(value: int | str, name: str = "id") -> int:
    """A database id: 1..2^63-1."""
    return count(value, name, lo=1, hi=MAX_ID)


def real(
    value: float | int | str,
    name: str,
    *,
    lo: float,
    hi: float,
    lo_open: bool = False,
    hi_open: bool = False,
    what: str = "a number",
) -> float:
    """A finite number in [lo, hi] (or with open ends)."""
    x = parse_real(value, name, what=what)
    if x < lo or x > hi or (lo_open and x == lo) or (hi_open and x == hi):
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        raise InvalidQuantity(
            f"{{{name}}} must be {what} in {left}{lo:g}, {hi:g}{right}, got {x:g}"
        )
    return x


def seconds(value: float | int | str, name: str = "seconds", *, allow_zero: bool = False) -> float:
    """A duration in seconds: > 0 (or >= 0), at most a year."""
    return real(
        value, name, lo=0.0, hi=MAX_SECONDS, lo_open=not allow_zero, what="a duration in seconds"
    )


def fraction(value: float | int | str, name: str, *, hi_open: bool = False) -> float:
    """A probability or fraction in [0, 1] (or [0, 1))."""
    return real(value, name, lo=0.0, hi=1.0, hi_open=hi_open, what="a fraction")


def price(value: float | int | str, name: str = "price") -> float:
    """A price >= 0, at most MAX_PRICE."""
    return real(value, name, lo=0.0, hi=MAX_PRICE, what="a price")


def coefficient(value: float | int | str, name: str, *, positive: bool = False) -> float:
    """A model coefficient >= 0 (or > 0), at most MAX_COEFFICIENT."""
    return real(value, name, lo=0.0, hi=MAX_COEFFICIENT, lo_open=positive, what="a number")


_CPU = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE](?P<exp>[+-]?[0-9]{1,3}))?(?P<m>m?)$"
)
CPU_FORMS = "cores like 2 or 1.5, or millicores like 500m"


def cpu_millis(
    value: str | float | int,
    name: str,
    *,
    lo: int = 0,
    hi: int = MAX_MILLIS,
) -> int:
    """A CPU amount in millicores from a Kubernetes CPU quantity: '2' and '1.5' are cores,
    '500m' millicores; numbers are cores. Whole millicores only, in [lo, hi]."""
    if isinstance(value, bool):
        raise InvalidQuantity(f"{{{name}}} must be a CPU amount ({CPU_FORMS}), got {value!r}")
    if isinstance(value, int | float):
        cores = parse_real(value, name, what="a CPU amount")
        exact = cores * 1000
    else:
        text = value.strip()
        match = _CPU.match(text) if len(text) <= 40 else None
        if match is None:
            raise InvalidQuantity(
                f"{{{name}}} is not a number of cores or millicores ({CPU_FORMS}): {_show(value)}"
            )
        exp = int(match.group("exp") or 0)
        if exp > 20 or exp < -20:
            raise InvalidQuantity(
                f"{{{name}}} must be a CPU amount of at most {hi // 1000} cores, got {_show(value)}"
            )
        number = float(match.group("num")) * 10.0**exp
        if match.group("sign") == "-":
            number = -number
        exact = number if match.group("m") else number * 1000
    if not math.isfinite(exact) or exact > hi:
        raise InvalidQuantity(
            f"{{{name}}} must be a CPU amount of at most {_cores(hi)}, got {_show(value)}"
        )
    if exact < 0 or (lo >= 1 and exact == 0):
        sign = "a positive CPU amount" if lo >= 1 else "a CPU amount >= 0"
        raise InvalidQuantity(f"{{{name}}} must be {sign} ({CPU_FORMS}), got {_show(value)}")
    millis = round(exact)
    if abs(exact - millis) > 1e-6 * max(1.0, exact):
        raise InvalidQuantity(
            f"{{{name}}} must be a whole number of millicores (1m = 0.001 cores), "
            f"got {_show(value)}"
        )
    if millis < lo:
        raise InvalidQuantity(
            f"{{{name}}} must be a CPU amount of at least {_cores(lo)}, got {_show(value)}"
        )
    return millis


def cpu_cores(value: str | float | int, name: str, *, positive: bool = True) -> float:
    """A CPU amount in cores (same forms as `cpu_millis`): '4', '2.5', '500m' -> 0.5."""
    return cpu_millis(value, name, lo=1 if positive else 0) / 1000


def _cores(millis: int) -> str:
    return f"{millis}m" if millis < 1000 else f"{millis / 1000:g} cores"


def list_text(text: str, name: str) -> str:
    """A list-valued option (weights, duty cycles): not empty, not absurdly long."""
    if not text.strip():
        raise InvalidQuantity(f"{{{name}}} is empty; give a comma-separated list such as 1,1,5,15")
    if len(text) > MAX_TEXT:
        raise InvalidQuantity(f"{{{name}}} is longer than {MAX_TEXT} characters")
    return text


def path_text(text: str, name: str) -> str:
    """A path as text: not empty, no NUL byte, within PATH_MAX and NAME_MAX."""
    if not text or not text.strip():
        raise InvalidQuantity(f"{{{name}}} is an empty path")
    if "\0" in text:
        raise InvalidQuantity(f"{{{name}}} contains a NUL byte; give a plain path")
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise InvalidQuantity(f"{{{name}}} is not a valid file name: {literal(text)}") from None
    if len(raw) >= PATH_MAX:
        raise InvalidQuantity(f"{{{name}}} is longer than {PATH_MAX - 1} bytes")
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            raise InvalidQuantity(
                f"{{{name}}} has a path component longer than {NAME_MAX} bytes: {literal(text)}"
            )
    return text
