"""Names a user gives that more than one layer checks."""

from __future__ import annotations

SOLVER_PATTERN = r"^[A-Za-z][A-Za-z0-9_.+-]{0,63}$"
"""A solver's name (a program of the Simulation's image, such as ``simpleFoam`` or
``rankloop-serial``): the spec's, the admission's and a staging answer's."""
