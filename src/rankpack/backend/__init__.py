"""Backends carry out actions: start rank pods, resize them, observe them, stop them.

`rankpack.backend.protocol.Backend` is the interface the run driver and the controller use;
`rankpack.backend.local.LocalBackend` implements it on this machine, a run's ranks in one
cgroup (a rank group),
`rankpack.backend.kubernetes` with one pod per rank. What both do with mpirun is written
once in `rankpack.backend.mpirun`; the backends never import each other. The simulated
cluster that tests and benchmarks drive is not a backend rankpack ships: it is
`rankpack.testing`.

- `protocol`: the `Backend` interface and the values it takes and returns;
- `mpirun`: finding, starting and stopping mpirun, its log and exit codes, the shim's
  records of a run (both backends);
- `worker`: staging in a worker thread (`Stager`) and the news `wait` waits on (`News`);
- `cgroups`: Linux cgroups v1/v2 with the kubelet's CPU mapping, and the one parser of
  their counters (the local backend; the Kubernetes node reader);
- `ranknice`: per-rank weights inside a rank group (nice values from requests);
- `local`: the local backend (a run's ranks in one cgroup on this machine);
- `kubernetes`: the Kubernetes backend (a pod per rank).
"""
