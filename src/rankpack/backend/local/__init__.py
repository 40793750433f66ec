"""The local backend: every MPI rank in its own cgroup on this machine ("rank pods").

`mpirun` (Open MPI by default) starts ``rank_launcher.sh`` once per rank; the launcher
writes its pid into ``rankpack/run-<sim>-<owner pid>/rank-<i>/cgroup.procs`` and execs the
solver, so the rank is contained before its first instruction. Resizing is a write to the
rank's cgroup files, exactly what the kubelet does for an in-place pod resize, so a resize
is complete when the write returns. The backend reads the solver log, the cgroup counters
and the PMPI shim's memory-mapped records itself and delivers them in observations.

Its rooms:

- `backend`: `LocalBackend`, the protocol's calls (launch, resize, observe, stop, adopt);
- `launching`: mpirun's command line and environment, the rank launcher, starting it;
- `rankcgroups`: a run's rank cgroups (create, resize, read, kill, remove) and the runs of
  other rankpack processes on this machine;
- `observing`: a run's state and its observation (phases, counters, why it failed).

What it shares with the Kubernetes backend (finding mpirun, stopping it, the shim's records,
the log, exit codes) is `rankpack.backend.mpirun`; the cgroup files are
`rankpack.backend.cgroups`.
"""

from __future__ import annotations

from rankpack.backend.local.backend import LocalBackend
from rankpack.backend.local.launching import launcher_path, mpirun_argv

__all__ = ["LocalBackend", "launcher_path", "mpirun_argv"]
