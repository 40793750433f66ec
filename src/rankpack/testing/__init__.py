"""What tests and benchmarks use to drive rankpack without a machine or a cluster to spare.

Not a backend rankpack runs on: no shipped layer imports this package (an import contract
in ``.importlinter`` keeps it so). Its modules:

- `simulated`: `SimulatedBackend`, backend protocol v2 on a simulated cluster in virtual
  time (the model is documented there);
- `simcluster`: `SimulatedCluster`, the world and clock every such backend shares;
- `simstate`: its records (simulations, ranks, resizes in flight) and the stage checks;
- `simnodes`: its nodes' load (`SimNodeLoad`) and speeds;
- `simresizes`: its resizes (`SimResizes`);
- `simmodel`: the model's settings and pure formulas, and the names a test builds a
  scenario from (`SimNode`, `SimulatedCase`, `SimTiming`, `RankFault`, `ResizeScript`);
- `simapi`: `ApiModel`, the apiserver's cost model.
"""
