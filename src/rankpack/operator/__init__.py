"""The operator: `Simulation` resources (group ``rankpack.dev``) run by the one control loop.

Its modules, from the resource to the running service:

- `crd`: the Simulation resource's definition, and its spec to and from a `Submission` (pure).
- `admission`: a spec admitted as data against the admin's policy, with reason codes, and
  the per-namespace queued/running limits.
- `tenancy`: the served namespaces, each one's run directories, volume and case roots.
- `simapi`: the Simulation client (`SimulationApi`) and how a Simulation is keyed.
- `simcache`: the served namespaces' Simulations, listed once and then watched.
- `listing`: one listing of the Simulations as the queue reads it (key, namespace, phase).
- `codec`: the staged case and what to resume from, as a status keeps them (JSON).
- `transitions`: what each step of a Simulation's life writes into its status (pure).
- `outbox`: every status write (`StatusOutbox`), coalesced and kept while the apiserver is away.
- `index`: which Simulation is which queue id, run, sim id and uid (`SimulationIndex`).
- `arrivals`: admission at arrival, the first time a listing shows a Simulation.
- `queue`: the control loop's job source on the Simulations (`SimulationQueue`).
- `adoption`: taking over what an earlier operator launched, at the start of every term.
- `status`: the loop's progress into each Simulation's status (`StatusWriter`).
- `display`: the operator's display: status, metrics and Events from each tick.
- `events`: Events on Simulations from the store's events.
- `metrics`: Prometheus metrics of the operator.
- `monitoring`: the alert rules and Grafana dashboard an admin installs
  (``deploy/monitoring/``).
- `plot`: the timeline of an operator's session.
- `lease`: leader election on a Lease.
- `service`: `rankpack operator`: terms of leadership, each running the control loop.
- `manifests`, `tenant_manifests`, `policy_manifest`: the builders ``deploy/`` is generated
  from; `deploy_files` writes it (``python -m rankpack.operator.deploy_files``).
"""
