"""The operator: `Simulation` resources (group ``rankpack.dev``) run by the one control loop.

`crd` defines the resource and converts it to and from a `Submission` (pure); `queue` is the
control loop's job source backed by the Simulations of a namespace, writing their status;
`service` runs the loop under a Lease (leader election), adopts what an earlier operator
launched, and serves Prometheus metrics (`metrics`).
"""
