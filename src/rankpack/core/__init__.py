"""The bottom layer: values every other layer may use and none of them owns.

Results of a run (`core.results`), CPU accounting (`core.accounting`) and the actions the
controller decides (`core.actions`). Nothing here imports another rankpack layer.
"""
