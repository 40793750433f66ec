"""What the Kubernetes backend learns of the nodes: its ranks' readings, the nodes' health,
what the cluster can hold. (What a lost node means for a simulation is the backend's
`lostnodes`.)

- `nodereader`: the node-side reader of rank pods' cgroup counters and shim records;
- `readings`: the `Readings` protocol and this node's files as a source;
- `agents`: `AgentReadings`, the client of the node agents;
- `sources`: which of the two the backend uses (`choose`);
- `nodehealth`: which nodes are lost, judged from Leases and Ready (pure);
- `capacity`: `ClusterCapacity`, the inventory and launch checks (nodes, pods, quota).
"""
