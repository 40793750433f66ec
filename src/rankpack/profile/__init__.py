"""Live MPI profiling through the PMPI shim (``shim/``): where the library is, the records it
publishes, and the duty-cycle arithmetic of seed 001 §3.

Data flow: the shim (C, in every rank) -> `records` (consistent snapshots of the per-rank
memory-mapped records) -> `duty` (pure maths) -> `sampling` (sample a live run, summarise)
-> the CLI (`rankpack profile`); the backends read the records for the control loop and
`tracker` follows duty cycles during a run (`rankpack profile CASE`). Also: `finals` (each
rank's totals, written by the shim when the rank ends, read bounded and schema-checked by
the backends once a run has ended), `shim` (where the built shim is and the environment
that loads it), `plot` (the duty-cycle bar chart). Which build of the shim a solver needs
(its MPI ABI family) is the case's: `rankpack.case.mpiabi`.
"""

from rankpack.profile.duty import (
    Counters,
    duty_between,
    iteration_duties,
    reclaimable_millis,
    steady_state_duty,
)
from rankpack.profile.records import FuncStats, RankRecord, read_record, read_records
from rankpack.profile.shim import shim_env, shim_library

__all__ = [
    "Counters",
    "FuncStats",
    "RankRecord",
    "duty_between",
    "iteration_duties",
    "read_record",
    "read_records",
    "reclaimable_millis",
    "shim_env",
    "shim_library",
    "steady_state_duty",
]
