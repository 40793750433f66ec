"""Backends carry out actions: start rank pods, resize them, observe them, stop them.

`rankpack.backend.protocol.Backend` is the interface the run driver and the controller use;
`rankpack.backend.local.LocalBackend` implements it with one cgroup per rank on this machine,
`rankpack.backend.kubernetes` with one pod per rank. What both do with mpirun is written
once in `rankpack.backend.mpirun`; the backends never import each other. The simulated
cluster that tests and benchmarks drive is not a backend rankpack ships: it is
`rankpack.testing`.
"""
