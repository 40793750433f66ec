"""Case layer: OpenFOAM cases (find, copy, mesh, decompose) and their solver logs.

Modules:

- `openfoam`: resolve a tutorial or directory, copy it into a run directory, mesh it,
  decompose it, edit its controlDict; `openfoam.HERE`, this process's own OpenFOAM;
- `foamtools`: where a case's OpenFOAM runs (the seam staging reaches a Simulation's image
  through, chosen once) and how a tool's process is supervised;
- `foamexec`: that seam through ``rankpack-exec``: a staging pod's sidecar in the
  Simulation's image;
- `staging`: a case copied into a fresh run directory, meshed and decomposed, ready to run,
  with the MPI ABI family its solver links;
- `mpiabi`: which MPI ABI family (and so which build of the shim) a program links, from the
  dynamic loader's listing of it;
- `confine`: confined staging of a case from someone with fewer rights than the stager;
- `sandbox`: the staging sandbox's program (``rankpack-stage``, what a staging pod runs);
- `stagewire`: the sandbox's request and its bounded answer (pure);
- `restart`: resuming a decomposed case from the last time it wrote (after a lost node);
- `refine`: refined copies of a case (blockMesh cell counts multiplied);
- `mesh`: polyMesh topology and geometry (cell centres, the cell adjacency graph);
- `partition`: cell-to-rank assignments whose sizes follow a weight vector (pure);
- `decomposition`: `decompose_case`, a weighted or concentric decomposition written for
  decomposePar's manual method, and the Scotch ``processorWeights`` route;
- `decomp_plot`: a picture of a decomposition (cell centres coloured by rank);
- `foamlog`: the incremental solver-log parser.
"""
