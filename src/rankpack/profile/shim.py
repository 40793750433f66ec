"""Where the built PMPI shim is, and the environment a launcher adds to every rank to use it.

Called by `rankpack profile` and the run driver. The libraries are built by
``make -C shim install`` into ``rankpack/_lib/`` (package data, not in git).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from rankpack.core.actions import parse_wait_mode
from rankpack.errors import UserError

FLAVOURS = ("openmpi", "mpich")
DEFAULT_YIELD_US = "1000"
"""How long into a polite wait ranks launched by rankpack keep calling sched_yield() before
they sleep (RANKPACK_SHIM_YIELD_US; see `shim_env`)."""


def shim_library(flavour: str) -> Path:
    """The shim built for an MPI flavour (``openmpi`` or ``mpich``)."""
    if flavour not in FLAVOURS:
        raise UserError(f"unknown MPI flavour '{flavour}'; use one of: {', '.join(FLAVOURS)}")
    path = Path(str(resources.files("rankpack"))) / "_lib" / f"librankpack_pmpi.{flavour}.so"
    if not path.is_file():
        raise UserError(
            f"the PMPI shim for {flavour} is not built ({path} missing); "
            "run `make -C shim install` in the rankpack source tree"
        )
    return path


TUNING = (
    "RANKPACK_SHIM_SPIN_US",
    "RANKPACK_SHIM_SPIN_MAX_US",
    "RANKPACK_SHIM_SLEEP_MIN_US",
    "RANKPACK_SHIM_SLEEP_MAX_US",
)
"""The polite back-off's knobs (shim/rankpack_pmpi.c), passed to the ranks when set here."""


def shim_env(
    live_dir: Path,
    wait_mode: str = "spin",
    trace_dir: Path | None = None,
    flavour: str = "openmpi",
    *,
    interval_us: int | None = None,
    window_ms: int | None = None,
    final_dir: Path | None = None,
) -> dict[str, str]:
    """Environment for every rank: LD_PRELOAD of the shim plus its RANKPACK_SHIM_* settings.

    An LD_PRELOAD already in this process's environment is kept after the shim. With
    ``final_dir`` each rank writes its final record there when it ends
    (`rankpack.profile.finals`).
    """
    parse_wait_mode(wait_mode)
    preload = str(shim_library(flavour))
    existing = os.environ.get("LD_PRELOAD", "")
    if existing and preload not in existing.split(":"):
        preload = f"{preload}:{existing}"
    env = {
        "LD_PRELOAD": preload,
        "RANKPACK_SHIM_DIR": str(live_dir),
        "RANKPACK_SHIM_WAIT": wait_mode,
        # The sched_yield phase (1 ms): a yield is a scheduling point, so a waiting rank
        # hands its core to a co-located simulation's rank that is owed time, in a cgroup
        # of its own too, and stays runnable (no wake-up latency). Two co-located copies of
        # the scaled pitzDaily, a cgroup per rank, quiet machine: 1.17x of two `spin` runs
        # one after the other with it, 0.66x without (sleeping after 5 us), and single runs
        # 30 % slower without it (docs/benchmarks.md, issue 13, sixth session). Earlier
        # measurements that set it to 0 had polite waits that never backed off (fixed in
        # the shim). A value in this process's environment wins.
        "RANKPACK_SHIM_YIELD_US": os.environ.get("RANKPACK_SHIM_YIELD_US", DEFAULT_YIELD_US),
    }
    for knob in TUNING:  # the back-off's tuning, for measuring it: passed on when set
        if knob in os.environ:
            env[knob] = os.environ[knob]
    if trace_dir is not None:
        env["RANKPACK_SHIM_TRACE"] = str(trace_dir)
    if interval_us is not None:
        env["RANKPACK_SHIM_INTERVAL_US"] = str(interval_us)
    if window_ms is not None:
        env["RANKPACK_SHIM_WINDOW_MS"] = str(window_ms)
    if final_dir is not None:
        env["RANKPACK_SHIM_FINAL_DIR"] = str(final_dir)
    return env
