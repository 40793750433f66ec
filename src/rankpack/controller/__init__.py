"""Controller layer: drives simulations on a backend.

`single` runs one simulation to its end (what `rankpack run` does); the multiplexing
controller drives several through the same `Backend` protocol.
"""
