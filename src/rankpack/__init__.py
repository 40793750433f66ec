"""rankpack: rank-aware CPU for MPI simulations.

Data flows one way: case/profile -> plan -> backend -> controller -> report.
The command line (`rankpack.cli`) is the only caller that ties the layers together.
"""

__version__ = "0.1.0"
