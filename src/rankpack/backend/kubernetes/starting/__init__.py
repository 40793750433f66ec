"""Starting a simulation's MPI ranks in their pods: mpirun on this host, or in a launcher pod.

- `mpirunargs`: mpirun's command line (Open MPI or MPICH's hydra), pure;
- `hostmpirun`: `MpirunHost`, mpirun on this host once every rank pod runs (host mode);
- `exitwrapper`: the detached parent of a host-mode mpirun that writes its exit code
  (``python -m rankpack.backend.kubernetes.starting.exitwrapper``), and the launch marker;
- `rsh`: the rsh agent a host-mode mpirun uses to start its daemons in the rank pods
  (``rankpack-exec``: ``pods/exec`` from this host);
- `tools`: ``rankpack-tools`` (``tools/``, static Go) put on a launcher-pod simulation's
  case volume: its rank pods' ``rankpack-rankd`` (entered by the simulation's key, decision
  0013), the launcher's rsh agent and its last step, ``rankpack-launch``, whatever the image;
- `launcher`: the launcher pod's init container (``rankpack-launcher INSTRUCTIONS OUT``):
  waits for the rank pods and writes what ``rankpack-launch`` runs;
- `instructions`: what the backend tells the launcher pod (`Instructions`, checked JSON);
- `podmode`: the backend's side of pod mode (writing the launcher's instructions,
  following the launcher pod).
"""
