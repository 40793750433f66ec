"""The bottom layer: values every other layer may use and none of them owns.

Modules: `results` (what a run produced), `accounting` (CPU-seconds and rates from usage
samples), `actions` (the actions the controller decides), `failures` (why a run failed or
is held, as codes), `names` (user-given names more than one layer checks). Nothing here
imports another rankpack layer.
"""
