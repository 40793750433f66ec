"""Starting a simulation's MPI ranks in their pods: mpirun on this host, or in a launcher pod.

- `mpirunargs`: mpirun's command line (Open MPI or MPICH's hydra), pure;
- `hostmpirun`: `MpirunHost`, mpirun on this host once every rank pod runs (host mode);
- `exitwrapper`: the detached parent of a host-mode mpirun that writes its exit code
  (``python -m rankpack.backend.kubernetes.starting.exitwrapper``), and the launch marker;
- `rsh`: the rsh agent mpirun uses to start its daemons in the rank pods
  (``rankpack-exec``: ``pods/exec`` from this host, the simulation's key from a launcher pod);
- `keyexec`: ``rankpack-rankd``, a launcher-pod simulation's rank pods entered by its key,
  and the agent's client of it (decision 0013);
- `launcher`: the launcher pod's program (``rankpack-launcher INSTRUCTIONS``);
- `instructions`: what the backend tells the launcher pod (`Instructions`, checked JSON);
- `podmode`: the backend's side of pod mode (writing the launcher's instructions,
  following the launcher pod).
"""
