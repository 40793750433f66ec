"""Case layer: OpenFOAM cases (find, copy, mesh, decompose) and their solver logs."""
