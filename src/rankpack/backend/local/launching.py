"""Starting a local run: the rank launcher, mpirun's command line and environment.

`mpirun` (Open MPI by default, MPICH's hydra if the solver was built with it) starts
``rank_launcher.sh`` once per rank; the launcher writes its pid into its run's cgroup
(``$RANKPACK_CGROUP_DIRS``; its own below it with ``$RANKPACK_CGROUP_PER_RANK``) and its
pid file (``$RANKPACK_PID_DIR``), then execs the solver at its nice value
(``$RANKPACK_RANK_NICE``), so the rank is contained and weighted before its first
instruction. If it cannot join its cgroup it exits with `LAUNCHER_NO_RANK` or
`LAUNCHER_NO_CGROUP` instead.

Called by `LocalBackend.launch`, which creates the run's cgroups in between.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import IO

from rankpack.backend.mpirun import (
    MpirunProcess,
    final_dir,
    prepare_final_dir,
    root_env,
    shim_dir,
)
from rankpack.backend.protocol import LaunchFailed, SimSpec
from rankpack.profile.shim import shim_env

LAUNCHER_NO_RANK = 97
"""``rank_launcher.sh``'s exit code when it finds no MPI rank (not started by mpirun)."""
LAUNCHER_NO_CGROUP = 98
"""``rank_launcher.sh``'s exit code when a rank cannot join its cgroup."""


CGROUP_VARIABLES = ("RANKPACK_CGROUP_DIRS", "RANKPACK_CGROUP_PER_RANK", "RANKPACK_RANK_NICE")
"""The launcher's cgroup and weight variables, set by the backend once the cgroups exist."""


def launcher_path() -> Path:
    """``rank_launcher.sh`` (made executable if the install lost the mode)."""
    path = Path(str(resources.files("rankpack.backend") / "rank_launcher.sh"))
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


def mpirun_argv(mpirun: str, flavour: str, n_ranks: int, env_names: list[str]) -> list[str]:
    """mpirun's options for ``n_ranks`` ranks on this machine, forwarding ``env_names``."""
    if flavour == "openmpi":
        argv = [mpirun, "-np", str(n_ranks), "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        for name in env_names:
            argv += ["-x", name]
        return argv
    argv = [mpirun, "-np", str(n_ranks)]
    if env_names:
        argv += ["-envlist", ",".join(env_names)]
    return argv


def pid_dir(case_dir: Path) -> Path:
    """Where the launcher writes each rank's pid (``rank-<i>.pid``)."""
    return case_dir / ".rankpack" / "pids"


def prepare_dirs(spec: SimSpec) -> Path:
    """Create the pid directory (without stale pid files) and the shim's directories, for
    its live records and for the ranks' final records (without an earlier run's); returns
    the pid directory."""
    pids = pid_dir(spec.case_dir)
    pids.mkdir(parents=True, exist_ok=True)
    for stale in pids.glob("rank-*.pid"):
        stale.unlink()
    if spec.shim is not None:
        shim_dir(spec.case_dir).mkdir(parents=True, exist_ok=True)
        prepare_final_dir(spec.case_dir, len(spec.ranks))
    return pids


def environment(spec: SimSpec, pids: Path) -> dict[str, str]:
    """mpirun's environment: this process's, the spec's, the shim's and the launcher's
    (without the cgroup variables: the caller adds them once the cgroups exist).
    UserError for an unknown wait mode or a missing shim library."""
    env = dict(os.environ)
    env.update(spec.env)
    if spec.shim is not None:
        live = shim_dir(spec.case_dir)
        env.update(shim_env(live, spec.shim.wait_mode, flavour=spec.shim.flavour,
                            final_dir=final_dir(spec.case_dir)))  # fmt: skip
    env["RANKPACK_PID_DIR"] = str(pids)
    for name in CGROUP_VARIABLES:
        env.pop(name, None)
    env.update(root_env(spec.mpi))
    return env


def command(spec: SimSpec, mpirun: str, env: dict[str, str]) -> list[str]:
    """The whole command line: mpirun, forwarding what the ranks need of ``env``, starting
    the launcher with the solver's command."""
    names = {"RANKPACK_PID_DIR", *CGROUP_VARIABLES, *spec.env}
    if spec.shim is not None:
        names |= {k for k in env if k.startswith("RANKPACK_SHIM_")} | {"LD_PRELOAD"}
    forwarded = sorted(names & set(env))
    argv = mpirun_argv(mpirun, spec.mpi, len(spec.ranks), forwarded)
    return [*argv, str(launcher_path()), *spec.command]


def start(spec: SimSpec, argv: list[str], env: dict[str, str]) -> tuple[MpirunProcess, IO[bytes]]:
    """Start ``argv`` in the case directory, appending to the solver log; returns the process
    and the open log (the caller closes it once the run is released). LaunchFailed if it
    cannot be started."""
    log_file = open(spec.log_path, "ab")  # noqa: SIM115 - the caller closes it
    try:
        return MpirunProcess(argv, spec.case_dir, env, log_file), log_file
    except OSError as exc:
        log_file.close()
        raise LaunchFailed(f"cannot start {argv[0]}: {exc}") from exc
