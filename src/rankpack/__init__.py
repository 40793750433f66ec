"""rankpack: rank-aware CPU for MPI simulations.

Data flows one way: case/profile -> plan -> backend -> controller -> report; the command
line ties the layers together. The packages, from the bottom up (`.importlinter`'s `flow`
contract holds this order):

- `errors`, `_proc`, `untrusted`, `quantities`, `paths`: error types, process checks,
  reading files a less-trusted party wrote (no link followed, bounded), the validation of
  every quantity and path a user gives.
- `core`: the typed values every layer passes on (actions, results, failures, accounting).
- `case`, `profile`, `model`, `plan`: OpenFOAM cases and their decomposition; the PMPI
  shim's records and duty cycles; the throughput model; per-rank CPU plans.
- `backend`, `store`: where ranks run (local cgroups, Kubernetes pods) and the SQLite store.
- `testing`: the simulated cluster, a backend for fast tests of the control loop (never
  shipped: no product module imports it).
- `controller`: the one control loop and its pure decision step.
- `report`: tables, figures and the HTML report.
- `nodeagent`, `operator`: the per-node agent and the `Simulation` operator.
- `devcluster`: the dev tool that stands up a real Kubernetes on this machine.
- `cli` and `__main__`: the command line.
"""

__version__ = "0.1.0"
