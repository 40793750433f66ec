"""Incremental parser for OpenFOAM solver logs.

The run driver feeds it new lines as the solver writes them (it never re-reads the file),
and the controller reads progress from it: phase transitions come from the solver log,
not from directory listings (seed 000 found those stale on NFS).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from rankpack import untrusted

_TIME = re.compile(r"^Time = (\S+)\s*$")
_EXEC = re.compile(r"^ExecutionTime = ([\d.eE+-]+) s\s+ClockTime = ([\d.eE+-]+) s")
_RESID = re.compile(r"Solving for (\w+), Initial residual = ([\d.eE+-]+)")


@dataclass
class LogState:
    """What the log has said so far."""

    time: float | None = None
    """The latest ``Time = …`` value (the iteration for steady solvers)."""
    iterations: int = 0
    """Completed time steps: ``ExecutionTime`` lines seen."""
    execution_s: float | None = None
    clock_s: float | None = None
    residuals: dict[str, float] = field(default_factory=dict)
    """Initial residual of each solved field in the latest step (first solve of the step)."""
    ended: bool = False
    """The solver printed ``End``."""
    converged: bool = False
    """A SIMPLE/PIMPLE residual control stopped the run before endTime."""
    fatal: str | None = None
    """First line of a FOAM FATAL ERROR / an MPI abort, if any."""
    iteration_clock: list[tuple[int, float]] = field(default_factory=list)
    """(iteration, ExecutionTime) per completed step, for per-iteration rates."""


class LogParser:
    def __init__(self) -> None:
        self.state = LogState()
        self._pending_fatal = False
        self._step_residuals: dict[str, float] = {}

    def feed_line(self, line: str) -> None:
        s = self.state
        line = line.rstrip("\n")
        stripped = line.strip()
        if self._pending_fatal and stripped:
            s.fatal = f"{s.fatal} {stripped}"[:300] if s.fatal else stripped[:300]
            self._pending_fatal = False
            return
        m = _TIME.match(stripped)
        if m:
            with contextlib.suppress(ValueError):
                s.time = float(m.group(1))
            self._step_residuals = {}
            return
        m = _RESID.search(stripped)
        if m:
            name = m.group(1)
            if name not in self._step_residuals:
                self._step_residuals[name] = float(m.group(2))
            return
        m = _EXEC.match(stripped)
        if m:
            s.iterations += 1
            s.execution_s = float(m.group(1))
            s.clock_s = float(m.group(2))
            if self._step_residuals:
                s.residuals = dict(self._step_residuals)
            s.iteration_clock.append((s.iterations, s.execution_s))
            return
        if stripped == "End":
            s.ended = True
        elif "reached convergence" in stripped or "solution converged in" in stripped:
            s.converged = True
        elif "FOAM FATAL" in stripped or "MPI_ABORT" in stripped:
            if s.fatal is None:
                s.fatal = stripped[:300]
                self._pending_fatal = "FOAM FATAL" in stripped
        elif s.fatal is None and (
            "mpirun noticed that process" in stripped
            or "exited on signal" in stripped
            or "Primary job  terminated normally, but" in stripped
        ):
            s.fatal = stripped[:300]

    def feed(self, text: str) -> None:
        for line in text.splitlines():
            self.feed_line(line)


CHUNK_MAX = 8 << 20
"""The most of a log one `LogFollower.poll` reads (the rest at the next)."""
LINE_MAX = 64 << 10
"""The longest line kept whole (a longer one is cut: a log written by a rank is untrusted)."""


class LogFollower:
    """Reads only what was appended to a log since the last call: a regular file only, never
    through a link (`rankpack.untrusted`), at most `CHUNK_MAX` a call, lines cut at
    `LINE_MAX`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.parser = LogParser()
        self._offset = 0
        self._partial = ""

    @property
    def state(self) -> LogState:
        return self.parser.state

    def poll(self) -> LogState:
        try:
            chunk = untrusted.read_bytes(self.path, CHUNK_MAX, self._offset)
        except OSError:  # not there yet, or not a regular file (a link put in its place)
            return self.parser.state
        self._offset += len(chunk)
        text = self._partial + chunk.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self._partial = lines.pop()[-LINE_MAX:]
        for line in lines:
            self.parser.feed_line(line[:LINE_MAX])
        return self.parser.state

    def finish(self) -> LogState:
        self.poll()
        if self._partial:
            self.parser.feed_line(self._partial)
            self._partial = ""
        return self.parser.state


def parse_log(path: Path) -> LogState:
    follower = LogFollower(path)
    return follower.finish()
