"""The local backend: a run's MPI ranks in one cgroup on this machine (a "rank group").

`mpirun` (Open MPI by default) starts ``rank_launcher.sh`` once per rank; the launcher
writes its pid into ``rankpack/run-<sim>-<owner pid>/cgroup.procs`` and execs the solver at
its nice value, so the rank is contained and weighted before its first instruction. The
run's cgroup weighs the sum of its ranks' requests, exactly as the kubelet weighs a pod's;
a rank's share inside it is its nice value (`rankpack.backend.ranknice`), so a rank waiting
in MPI can yield its core to a peer (docs/decisions/0012-rank-groups.md). A run with hard
limits has a cgroup per rank below the run's instead (``rank-<i>``: a quota needs one).
Resizing is a write to the cgroup files and the ranks' nice values, complete when the write
returns. The backend reads the solver log, the counters and the PMPI shim's memory-mapped
records itself and delivers them in observations.

Its rooms:

- `backend`: `LocalBackend`, the protocol's calls (launch, resize, observe, stop, adopt);
- `launching`: mpirun's command line and environment, the rank launcher, starting it;
- `rankcgroups`: a run's cgroups (create, resize, read, kill, remove) and the runs of
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
