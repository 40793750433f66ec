"""The Kubernetes backend: one pod per MPI rank, CPU requests resized in place (pods/resize).

See ``docs/decisions/0008-kubernetes-launcher.md`` and ``0010-node-agent.md``. Sub-packages:

- `api`: the boundary to the Kubernetes API (the `KubeApi` interface, its client, the
  connection settings, the shared watch cache);
- `objects`: a simulation's Kubernetes objects (pure builders, pod-status readings,
  RBAC, quota and LimitRange rules, creating and deleting them);
- `nodes`: what the nodes say (rank readings from this node or the node agents, node
  health, the cluster's capacity);
- `starting`: starting MPI ranks (mpirun on this host and its exit wrapper, the rsh agent,
  the launcher pod's program and the backend's pod mode).

Modules:

- `backend`: `KubernetesBackend`, backend protocol v2 over one namespace (delegates to
  the modules below);
- `connect`: `connect`, `connect_api`, `connect_namespaces` (a checked backend or client);
- `tenants`: `NamespacedBackends`, one backend over several namespaces;
- `state`: `BackendState`, what the backend's parts share (API, settings, cache, records);
- `launch`: the launch path (a new simulation's checks, record and objects);
- `adoption`: earlier processes' simulations, listed and taken over;
- `resizing`: a rank's ``pods/resize`` and what its answer says;
- `lostnodes`: `NodeWatch`, a lost node's simulations (`NodeLost`) from the cached nodes
  and Leases;
- `poller`: the follower thread that acts on each change of the rank pods;
- `podstaging`: staging a confined case in a staging pod and reading its answer;
- `record`: what the backend knows of one simulation (`SimRecord`, `Lifecycle`);
- `observe`: what `observe` reports of one simulation, read from its record.
"""
