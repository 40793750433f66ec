"""What the Kubernetes backend learns of the nodes: its ranks' readings, the nodes' health,
what the cluster can hold. (What a lost node means for a simulation is the backend's
`lostnodes`.)

- `nodereader`: the node-side reader of rank and group pods' counters and shim records, the
  setter of their ranks' wait modes and nice values;
- `rankprocs`: which host process is a group pod's rank (its pid file, its pod's cgroup);
- `rankwire`: a rank's reading in ``/v1/ranks``, written and checked;
- `readings`: the `Readings` protocol and this node's files as a source;
- `agents`: `AgentReadings`, the client of the node agents;
- `sources`: which of the two the backend uses (`choose`);
- `nodehealth`: which nodes are lost, judged from Leases and Ready (pure);
- `capacity`: `ClusterCapacity`, the inventory and launch checks (nodes, pods, quota).
"""
