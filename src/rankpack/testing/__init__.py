"""What tests and benchmarks use to drive rankpack without a machine or a cluster to spare.

Not a backend rankpack runs on: no shipped layer imports this package (an import contract
in ``.importlinter`` keeps it so). Its rooms:

- `simulated`: `SimulatedBackend`, backend protocol v2 on a simulated cluster in virtual
  time (the model is documented there), and the names a test builds a scenario from;
- `simcluster`: `SimulatedCluster`, the world and clock every such backend shares;
- `simstate`, `simnodes`, `simresizes`: its records, its nodes' load and speeds, its resizes;
- `simmodel`: the model's settings and pure formulas.
"""
