"""Waiting in the k8s tier: a condition polled until it holds or a deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(
    what: str,
    cond: Callable[[], object],
    timeout_s: float,
    *,
    poll_s: float = 1.0,
    said: Callable[[], object] | None = None,
) -> None:
    """Return once ``cond()`` is true; `AssertionError` naming ``what`` (and ``said()``, if
    given: the state to show) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(poll_s)
    extra = f": {said()}" if said is not None else ""
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{extra}")
