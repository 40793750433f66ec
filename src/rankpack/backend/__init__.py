"""Backends carry out actions: start rank pods, resize them, observe them, stop them.

`rankpack.backend.protocol.Backend` is the interface the run driver and the controller use;
`rankpack.backend.local.LocalBackend` implements it with one cgroup per rank on this machine.
"""
